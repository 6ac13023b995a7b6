"""Import an ERNIE folder (``model_type: ernie``: ERNIE 1.0 / 2.0 / 3.0, as transformers converts them).

ERNIE is BERT with one more embedding table when ``use_task_id`` is set: e = LN(word + type +
position + task[t]). transformers feeds task id 0 unless told otherwise, so the task row 0 is one
vector added to every token: it is folded into the position table, and the model takes no task
input (a folder meant for another task id would need that id; ortformer follows transformers'
default). The rest is bert.py's import under the ``ernie.`` prefix.
"""
from __future__ import annotations


from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..bert_layout import bert_fields, check_bert_layout, map_bert_layout
from ..config_checks import make_config
from ..folder_import import import_folder
from ..folder_files import FolderFiles
from ..folder_layout import HF_DTYPES
from ..family import Family, VocabTokenizer
from ..vocab_tokenizers import wordpiece_tokenizer

TASK_TABLE = "embeddings.task_type_embeddings.weight"


def ernie_config(hf: dict, common: dict):
    check_bert_layout(hf, "ERNIE ")
    return make_config("ERNIE", **bert_fields(hf), **common)


def map_weights(raw: Tensors, cfg, what: str, duplicates, tasks: int):
    """bert.py's mapping; with ``tasks`` task types, their table's row 0 added to the positions."""
    task = next((name for name in raw if name.removeprefix("ernie.") == TASK_TABLE), None) if tasks else None
    if task is None:  # without use_task_id a task table in the file is unexpected, as any other
        return map_bert_layout(raw, cfg, what, duplicates, prefix="ernie.")
    raw = dict(raw)
    table = raw.pop(task)
    check_tensors({task: table}, {task: (tasks, cfg.hidden_size)}, dtypes=HF_DTYPES, what=what)
    mapped, dropped = map_bert_layout(raw, cfg, what, duplicates, prefix="ernie.")
    mapped["positions.table.weight"] = mapped["positions.table.weight"].float() + table[0].float()
    return mapped, dropped


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import an ERNIE folder as an ortformer Encoder."""
    files = FolderFiles.of(folder)  # parsed once: load_any hands over the files it read
    hf = files.config
    tasks = hf.get("task_type_vocab_size", 3) if hf.get("use_task_id") else 0
    if hf.get("use_task_id") and (isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1):
        raise CheckpointError(f"ERNIE config.json task_type_vocab_size={tasks!r} is not supported; it must be an int >= 1")

    def weights(raw, cfg, what, duplicates):
        return map_weights(raw, cfg, what, duplicates, tasks)

    return import_folder(files, family="ernie", build=ernie_config, map_weights=weights,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("ERNIE", ("ernie",), load,
                vocab_tokenizers={"ernie": VocabTokenizer(wordpiece_tokenizer, ("vocab.txt",))})
