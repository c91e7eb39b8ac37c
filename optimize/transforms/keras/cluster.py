"""Weight clustering (tfmot): share a few centroid values per layer, fine-tune, strip the wrappers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from optimize.core.registry import Context, Params, Stage, technique
from optimize.models import _tf
from optimize.transforms.keras.common import fine_tune, require_keras2, teacher_outputs, wrap_supported

INITS = {"kmeans++": "KMEANS_PLUS_PLUS", "density": "DENSITY_BASED", "linear": "LINEAR", "random": "RANDOM"}


class ClusterParams(Params):
    clusters: int = Field(16, ge=2, le=256, description="Distinct weight values per layer.")
    init: Literal["kmeans++", "density", "linear", "random"] = Field("kmeans++", description="Centroid initialisation.")
    preserve_sparsity: bool = Field(False, description="Keep zeros from an earlier pruning step at zero.")
    epochs: int = Field(1, ge=1, le=1000, description="Fine-tuning epochs.")
    batch_size: int = Field(32, ge=1)
    learning_rate: float = Field(1e-4, gt=0)


def _too_small(model, clusters: int) -> dict[str, int]:
    """Layers whose smallest weight matrix has fewer values than clusters (k-means cannot place them)."""
    out = {}
    for layer in model.layers:
        sizes = [int(w.shape.num_elements()) for w in layer.weights if len(w.shape) >= 2]
        if sizes and min(sizes) < clusters:
            out[layer.name] = min(sizes)
    return out


@technique("cluster", stage=Stage.KERAS, params=ClusterParams)
def cluster(model, params: ClusterParams, ctx: Context):
    """Weight clustering with tfmot, layer by layer, fine-tuned on the context's data, wrappers stripped.

    Like pruning, clustering shrinks the compressed size, not the raw .tflite (unless followed by int8).
    """
    require_keras2(model, "cluster")
    tfmot = _tf.tfmot()
    clustering = tfmot.clustering.keras
    init = getattr(clustering.CentroidInitialization, INITS[params.init])
    # tfmot has no public "is this layer clusterable?": its registry is the only source of that answer.
    from tensorflow_model_optimization.python.core.clustering.keras import clustering_registry

    def wrap(layer):
        return clustering.cluster_weights(  # the public API; it passes preserve_sparsity through
            layer,
            number_of_clusters=params.clusters,
            cluster_centroids_init=init,
            preserve_sparsity=params.preserve_sparsity,
        )

    small = _too_small(model, params.clusters)

    def supports(layer) -> bool:
        known = clustering_registry.ClusteringRegistry.supports(layer) or isinstance(layer, clustering.ClusterableLayer)
        return known and layer.name not in small

    teacher = teacher_outputs(model, ctx)  # what outputs without labels keep to (before any weight moves)
    wrapped = wrap_supported(model, supports, wrap, ctx, "cluster")
    if small:
        listed = ", ".join(f"{name} ({n} weights)" for name, n in small.items())
        ctx.notes.append(
            f"cluster: {len(small)} layer(s) have fewer weights than {params.clusters} clusters and "
            f"were left unclustered: {listed}."
        )
    fine_tune(
        wrapped, ctx, params.epochs, params.batch_size, params.learning_rate, technique="cluster", teacher=teacher
    )
    return clustering.strip_clustering(wrapped)
