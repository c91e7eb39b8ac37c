"""Where LiteRT's documentation and its source disagree about a delegate, which one holds, and why.

These are data, so the compat report (a hint), the recommender and the docs can all state the same
thing with the same citations. The rules modules follow the source; each record says what the source
does, from which API level, and cites both sides at LiteRT f67457790c9c.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimize.core.vocab import Delegate, Scheme


@dataclass(frozen=True)
class SourceConflict:
    """A documented claim, what the code does instead, and which one this package follows."""

    delegate: Delegate
    scheme: Scheme
    docs_claim: str
    docs_citation: str
    holds: str  # "source" or "docs": which one the rules follow
    from_api: int  # the lowest Android API level where the statement below holds
    statement: str
    citations: tuple[str, ...]

    @property
    def hint(self) -> str:
        """One line for a report: what holds, from which API level, with the citations."""
        return f"{self.delegate.upper()}: {self.statement} (source: {'; '.join(self.citations)})"


NNAPI_FLOAT16 = SourceConflict(
    delegate=Delegate.NNAPI,
    scheme=Scheme.FLOAT16,
    docs_claim="NNAPI does not support post-training float16 quantization.",
    docs_citation="tflite/g3doc/performance/delegates.md:104 @ LiteRT f67457790c9c",
    holds="source",
    from_api=27,
    statement=(
        "the docs table says NNAPI does not take float16 models, but nnapi_delegate.cc does, from API 27 "
        "(every level the NNAPI delegate runs on): it folds each constant float16 DEQUANTIZE into its "
        "consumers and expands the weights to float32 when it builds the NNAPI model, so the accelerator "
        "computes in float32 (float16 only with allow_fp16) and the file stays half size. On API 29+ with "
        "a named accelerator the float16 model is all-or-nothing: if the driver refuses any node, nothing "
        "is delegated"
    ),
    citations=(
        "nnapi_delegate.cc:6893-6911 (const float16 DEQUANTIZE found, FP16 remapping)",
        "nnapi_delegate.cc:6793-6823 (FP16GraphPartitionHelper)",
        "nnapi_delegate.cc:5613-5622, 1978-1999 (float16 weights converted to float32)",
        "nnapi_delegate.cc:7035-7062 (driver refusal restores the whole graph)",
    ),
)

#: Every known disagreement, for reports and the recommender.
SOURCE_CONFLICTS: tuple[SourceConflict, ...] = (NNAPI_FLOAT16,)
