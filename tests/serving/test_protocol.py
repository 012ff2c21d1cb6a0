"""Wire models: validation rules and the error envelope (no model needed)."""

import pytest
from hallulog.serving import protocol as P
from pydantic import ValidationError


def chat(**kw):
    return P.ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **kw)


def test_chat_defaults_and_helpers():
    req = chat(stop="x", kv_transfer_params={"include_output_tokens": True})
    assert req.n == 1 and req.temperature is None and req.num_top_logprobs() is None
    assert req.stop_list() == ["x"]
    assert req.include_output_tokens()
    assert chat(logprobs=True).num_top_logprobs() == 0
    assert chat(logprobs=True, top_logprobs=5).num_top_logprobs() == 5
    assert chat(max_completion_tokens=7, max_tokens=3).token_limit() == 7


@pytest.mark.parametrize(
    "kw",
    [
        {"top_logprobs": 5},  # without logprobs=true
        {"logprobs": True, "top_logprobs": 21},
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"n": 0},
        {"max_tokens": 0},
        {"stream": True},
    ],
)
def test_chat_rejects(kw):
    with pytest.raises(ValidationError):
        chat(**kw)


def test_chat_content_parts():
    msg = P.ChatMessage(
        role="user", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    )
    assert msg.text() == "ab"
    with pytest.raises(ValidationError):
        P.ChatCompletionRequest(messages=[{"role": "user", "content": [{"type": "image_url"}]}])


def test_completion_prompt_forms():
    assert P.CompletionRequest(prompt="hello").prompt == "hello"
    assert P.CompletionRequest(prompt=[1, 2, 3]).prompt == [1, 2, 3]
    for bad in ([], [-1], ["a", "b"], [[1, 2]]):
        with pytest.raises(ValidationError):
            P.CompletionRequest(prompt=bad)
    with pytest.raises(ValidationError):
        P.CompletionRequest(prompt="x", echo=True)


def test_unknown_fields_are_ignored():
    req = P.CompletionRequest(prompt="x", frequency_penalty=0.0, user="me")
    assert req.prompt == "x"


def test_error_body():
    body = P.error_body("bad", 400)
    assert body == {
        "error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}
    }
    assert P.error_body("x", 404)["error"]["type"] == "NotFoundError"
    assert P.error_body("x", 500)["error"]["type"] == "InternalServerError"
