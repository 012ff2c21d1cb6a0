"""storage's errors are a branch of hallulog's one error tree, each also its builtin."""

from __future__ import annotations

import pytest
from hallulog.contracts.errors import HallulogError
from hallulog.storage.errors import ManifestError, StoreNotFoundError, UnknownFormatError

from hallulog import storage


def test_unknown_format_name_is_a_value_error_of_the_tree(tmp_path):
    with pytest.raises(UnknownFormatError, match="unknown storage format 'parquet'") as err:
        storage.open_writer("parquet", tmp_path, layer_ids=[0], hidden_size=4)
    assert isinstance(err.value, ValueError) and isinstance(err.value, HallulogError)


def test_a_missing_store_is_file_not_found(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="no such file or directory") as err:
        storage.open_store(missing)
    assert isinstance(err.value, StoreNotFoundError) and err.value.path == str(missing)
    with pytest.raises(UnknownFormatError, match="no packed, zarr or npy activation store"):
        storage.open_store(tmp_path)  # exists, holds no store


def test_a_malformed_index_names_file_and_line(tmp_path):
    (tmp_path / "activation_index.jsonl").write_text("not json\n")
    with pytest.raises(ManifestError, match=r"activation_index\.jsonl:1: unparsable JSON") as err:
        storage.open_store(tmp_path)
    assert isinstance(err.value, ValueError) and isinstance(err.value, HallulogError)
