
import pytest

from fleetcli.cli import build_parser, main
from fleethealth.bus import InProcessBus, JsonlBus
from fleethealth.config import ConfigError, KafkaSettings, load_config, open_bus, section


def test_config_errors_name_file_and_key(tmp_path):
    p = tmp_path / "fh.toml"
    p.write_text('[kafka]\nbootstrap = 9092\n')
    cfg = load_config(p)
    with pytest.raises(ConfigError, match=r"fh.toml: \[kafka\]\.bootstrap: Expected `str`"):
        section(cfg, "kafka", KafkaSettings)
    p.write_text('[kafka]\nbootstrp = "x"\n')
    with pytest.raises(ConfigError, match="unknown field `bootstrp`"):
        section(load_config(p), "kafka", KafkaSettings)
    p.write_text("[nonsense]\na=1\n")
    with pytest.raises(ConfigError, match="unknown section"):
        load_config(p)
    p.write_text("[kafka\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_env_var_picks_config_file(tmp_path, monkeypatch):
    p = tmp_path / "fh.toml"
    p.write_text('[kafka]\nbootstrap = "10.0.0.1:9092"\n')
    monkeypatch.setenv("FLEETHEALTH_CONFIG", str(p))
    assert section(load_config(), "kafka", KafkaSettings).bootstrap == "10.0.0.1:9092"


def test_open_bus_specs(tmp_path):
    assert isinstance(open_bus("memory"), InProcessBus)
    assert isinstance(open_bus(f"jsonl:{tmp_path}/x.jsonl"), JsonlBus)
    with pytest.raises(ConfigError, match="unknown bus"):
        open_bus("carrier-pigeon")
    with pytest.raises(ConfigError, match="needs a path"):
        open_bus("jsonl:")


def test_every_subcommand_has_help_with_env_vars():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        text = p.format_help()
        assert p.description or p.format_usage(), name
        for action in p._actions:
            if action.option_strings and action.dest not in ("help",) and action.help != "==SUPPRESS==":
                assert "[env: FLEETHEALTH_" in (action.help or ""), f"{name} {action.option_strings} lacks an env var"
        assert text


def test_main_without_command_prints_help(capsys):
    assert main([]) == 0
    assert "fleet.telemetry.v1" in capsys.readouterr().out
