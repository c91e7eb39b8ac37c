"""Where the model will run: the device facts each delegate's decision depends on, with documented defaults."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# NNAPI runtime feature levels above Android 12 (nnapi_delegate_kernel.h): not plain API numbers.
NNAPI_FL6, NNAPI_FL7, NNAPI_FL8 = 1000006, 1000007, 1000008


class TargetParams(BaseModel):
    """Device parameters for the delegate rules. Defaults follow each delegate's own defaults.

    Partition overrides: None keeps the delegate's default (GPU 1, NNAPI 3, Hexagon 4, Core ML unlimited
    partitions; min nodes GPU 0, NNAPI 0, Hexagon 2, Core ML 2).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    android_api: int = Field(30, ge=1, description="Android API level (NNAPI needs >= 27). 30 = Android 11.")
    nnapi_feature_level: int | None = Field(
        None,
        description="NNAPI feature level the rules compare against. None: derived from android_api "
        "(<= 31 as is; 33 -> 1000006 (FL6), 34 -> 1000007, >= 35 -> 1000008).",
    )
    nnapi_disallow_cpu: bool = Field(
        True, description="NNAPI default: never use the nnapi-reference CPU device (sets is_accelerator_specified)."
    )
    coreml_version: int = Field(3, ge=2, le=3, description="Core ML model version: 3 on iOS 13+, 2 on iOS 12.")
    gpu_allow_quant: bool = Field(True, description="GPU TFLITE_GPU_EXPERIMENTAL_FLAGS_ENABLE_QUANT (default on).")
    gpu_opencl: bool = Field(
        True, description="OpenCL available on the device (without it SPLIT/SPLIT_V are excluded)."
    )
    gpu_max_partitions: int | None = Field(None, description="GPU max_delegated_partitions (default 1; <= 0 means 1).")
    gpu_min_nodes: int | None = Field(None, ge=0, description="GPU min nodes per partition (default 0).")
    nnapi_max_partitions: int | None = Field(
        None, description="NNAPI max_number_delegated_partitions (default 3; <= 0 unlimited)."
    )
    nnapi_min_nodes: int | None = Field(None, ge=0, description="NNAPI min nodes per partition (default 0).")
    hexagon_max_partitions: int | None = Field(
        None, description="Hexagon max_delegated_partitions (default 4, capped at 16)."
    )
    hexagon_min_nodes: int | None = Field(None, ge=0, description="Hexagon min_nodes_per_partition (default 2).")
    coreml_max_partitions: int | None = Field(
        None, description="Core ML max_delegated_partitions (default 0 = unlimited)."
    )
    coreml_min_nodes: int | None = Field(None, ge=0, description="Core ML min_nodes_per_partition (default 2).")

    @property
    def nnapi_level(self) -> int:
        """The 'target feature level' L that NNAPI's Validate compares against."""
        if self.nnapi_feature_level is not None:
            return self.nnapi_feature_level
        api = self.android_api
        if api <= 31:
            return api
        if api == 32:
            return 31
        return {33: NNAPI_FL6, 34: NNAPI_FL7}.get(api, NNAPI_FL8)

    @property
    def nnapi_is_accel(self) -> bool:
        """is_accelerator_specified: true by default on API >= 29 (disallow_nnapi_cpu)."""
        return self.nnapi_disallow_cpu and self.android_api >= 29
