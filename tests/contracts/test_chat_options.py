"""--chat-template-kwargs and --thinking: the JSON rule, the merge rule, one-line errors."""

from __future__ import annotations

import pytest
from hallulog.config.run_config import RunConfig
from hallulog.contracts.chat_options import template_kwargs
from hallulog.contracts.errors import ConfigError
from hallulog.contracts.ids import fingerprint


def test_auto_adds_nothing_and_on_off_set_enable_thinking():
    assert template_kwargs(None) == {}
    assert template_kwargs('{"reasoning_effort": "low"}') == {"reasoning_effort": "low"}
    assert template_kwargs(None, "off") == {"enable_thinking": False}
    assert template_kwargs('{"x": 1}', "on") == {"x": 1, "enable_thinking": True}
    assert template_kwargs('{"enable_thinking": true}', "on") == {"enable_thinking": True}


@pytest.mark.parametrize(
    ("kwargs", "thinking", "message"),
    [
        ("{bad", "auto", "--chat-template-kwargs: not valid JSON"),
        ("[1, 2]", "auto", "--chat-template-kwargs: a JSON object is needed, got list"),
        ('{"enable_thinking": false}', "on", "--thinking on disagrees with"),
    ],
)
def test_bad_values_are_one_config_error_naming_the_flag(kwargs, thinking, message):
    with pytest.raises(ConfigError, match="^" + message) as info:
        RunConfig(chat_template_kwargs=kwargs, thinking=thinking)
    assert "\n" not in str(info.value)


def test_the_fields_enter_the_fingerprint_only_when_set():
    default = fingerprint(RunConfig().fingerprint_fields())
    assert "thinking" not in RunConfig().fingerprint_fields()
    assert "chat_template_kwargs" not in RunConfig().fingerprint_fields()
    assert fingerprint(RunConfig(thinking="auto").fingerprint_fields()) == default
    assert fingerprint(RunConfig(thinking="off").fingerprint_fields()) != default
    assert RunConfig(chat_template_kwargs="{}").fingerprint_fields()["chat_template_kwargs"] == "{}"


def test_the_config_file_sets_them(tmp_path):
    from hallulog.config.config_file import load_study

    path = tmp_path / "study.toml"
    path.write_text('thinking = "off"\nchat_template_kwargs = \'{"reasoning_effort": "low"}\'\n')
    config = RunConfig(**load_study(path).values)
    kwargs = template_kwargs(config.chat_template_kwargs, config.thinking)
    assert kwargs == {"reasoning_effort": "low", "enable_thinking": False}
