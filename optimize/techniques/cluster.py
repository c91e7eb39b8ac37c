"""Weight clustering (tfmot): share a few centroid values per layer, fine-tune, strip the wrappers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .. import _tf
from ..registry import Context, Params, Stage, technique
from ._keras import fine_tune, require_keras2, wrap_supported

INITS = {"kmeans++": "KMEANS_PLUS_PLUS", "density": "DENSITY_BASED", "linear": "LINEAR", "random": "RANDOM"}


class ClusterParams(Params):
    clusters: int = Field(16, ge=2, le=256, description="Distinct weight values per layer.")
    init: Literal["kmeans++", "density", "linear", "random"] = Field("kmeans++", description="Centroid initialisation.")
    preserve_sparsity: bool = Field(False, description="Keep zeros from an earlier pruning step at zero.")
    epochs: int = Field(1, ge=1, le=1000, description="Fine-tuning epochs.")
    batch_size: int = Field(32, ge=1)
    learning_rate: float = Field(1e-4, gt=0)


@technique("cluster", stage=Stage.KERAS, params=ClusterParams)
def cluster(model, params: ClusterParams, ctx: Context):
    """Weight clustering with tfmot, layer by layer, fine-tuned on the context's data, wrappers stripped.

    Like pruning, clustering shrinks the compressed size, not the raw .tflite (unless followed by int8).
    """
    require_keras2(model, "cluster")
    tfmot = _tf.tfmot()
    clustering = tfmot.clustering.keras
    init = getattr(clustering.CentroidInitialization, INITS[params.init])
    from tensorflow_model_optimization.python.core.clustering.keras import clustering_registry
    from tensorflow_model_optimization.python.core.clustering.keras.experimental import cluster as experimental

    def wrap(layer):
        return experimental.cluster_weights(
            layer,
            number_of_clusters=params.clusters,
            cluster_centroids_init=init,
            preserve_sparsity=params.preserve_sparsity,
        )

    def supports(layer) -> bool:
        return clustering_registry.ClusteringRegistry.supports(layer) or isinstance(layer, clustering.ClusterableLayer)

    wrapped = wrap_supported(model, supports, wrap, ctx, "cluster")
    fine_tune(wrapped, ctx, params.epochs, params.batch_size, params.learning_rate, technique="cluster")
    return clustering.strip_clustering(wrapped)
