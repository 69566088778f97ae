"""XSum (Narayan et al. 2018): BBC article -> one-sentence summary, ROUGE."""

from __future__ import annotations

from typing import ClassVar

from tasks.summarization import SummarizationTask


class XSum(SummarizationTask):
    name: ClassVar[str] = "xsum"
    hf_id: ClassVar[str] = "EdinburghNLP/xsum"
    hf_config: ClassVar[str | None] = None
    hf_split: ClassVar[str] = "test"
    local_file: ClassVar[str] = "xsum/test.jsonl"
    article_field: ClassVar[str] = "document"
    reference_field: ClassVar[str] = "summary"
