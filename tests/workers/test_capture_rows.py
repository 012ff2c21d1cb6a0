"""Token alignment of stored rows (docs/alignment.md)."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from workers.capture import CaptureError, load_capture, select_rows

P, R, L, H = 5, 4, 3, 2


def _hidden(num_tokens):
    # value = position, so rows can be checked by their token position
    pos = np.arange(num_tokens, dtype=np.float32)[:, None, None]
    return np.broadcast_to(pos, (num_tokens, L, H)).copy()


@pytest.mark.parametrize("num_tokens", [P + R - 1, P + R])
@pytest.mark.parametrize("mode,first,prompt_rows", [
    ("all", 0, P), ("prompt", 0, P), ("response", P - 1, 1), ("last", None, 0)])
def test_rows_follow_the_alignment_convention(num_tokens, mode, first, prompt_rows):
    rows = select_rows(_hidden(num_tokens), prompt_len=P, response_len=R, sequence_mode=mode,
                       layer_index=None, dtype="float16")
    assert rows.acts.shape[0] == L and rows.acts.dtype == np.float16
    positions = rows.acts[0, :, 0].astype(int).tolist()
    start = num_tokens - 1 if first is None else first
    assert positions[0] == rows.row0_position == start
    assert positions == list(range(start, start + len(positions)))
    if mode == "prompt":
        assert len(positions) == P
    if mode in ("all", "response", "last"):
        assert positions[-1] == num_tokens - 1
    assert rows.prompt_rows == prompt_rows
    assert rows.prompt_rows + rows.response_rows == len(positions)


def test_wrong_token_count_is_refused():
    with pytest.raises(CaptureError):
        select_rows(_hidden(P + R + 3), prompt_len=P, response_len=R, sequence_mode="all",
                    layer_index=None, dtype="float32")


def test_load_capture_checks_token_ids_and_deletes(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file({"hidden_states": _hidden(3), "token_ids": np.array([1, 2, 3], dtype=np.int64)},
              str(path))
    assert load_capture(str(path), [1, 2, 3]).shape == (3, L, H)
    assert not path.exists()
    save_file({"hidden_states": _hidden(3), "token_ids": np.array([1, 2, 4], dtype=np.int64)},
              str(path))
    with pytest.raises(CaptureError, match="token ids differ"):
        load_capture(str(path), [1, 2, 3])
    path.write_bytes(b"\x10\x00\x00")
    with pytest.raises(CaptureError, match="unreadable"):
        load_capture(str(path), [1])
