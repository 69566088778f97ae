"""CNN/DailyMail 3.0.0 (Hermann et al. 2015; See et al. 2017): news article -> highlights, ROUGE."""

from __future__ import annotations

from typing import ClassVar

from tasks.summarization import SummarizationTask


class CNNDailyMail(SummarizationTask):
    name: ClassVar[str] = "cnn_dm"
    hf_id: ClassVar[str] = "abisee/cnn_dailymail"
    hf_config: ClassVar[str | None] = "3.0.0"
    hf_split: ClassVar[str] = "test"
    local_file: ClassVar[str] = "cnn_dailymail/test.jsonl"
    article_field: ClassVar[str] = "article"
    reference_field: ClassVar[str] = "highlights"
