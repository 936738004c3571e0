"""The ctypes binding agrees with the C headers and the library: struct layouts
(compiled offsetof/sizeof), constants, name tables, errors, library discovery."""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

import ddplug
from ddplug import errors
from ddplug._c import _capi, _names
from ddplug._c import _capi as S

HEADERS = ROOT / "abi" / "include"


def _compile_and_run(tmp_path: Path, body: str) -> dict:
    """Compile a C program printing 'name value' lines against the headers."""
    src = tmp_path / "probe.c"
    src.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"ddplug/ddplug.h\"\n"
        "int main(void) {\n" + body + "  return 0;\n}\n"
    )
    exe = tmp_path / "probe"
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", f"-I{HEADERS}", str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {line.split()[0]: int(line.split()[1]) for line in out.splitlines() if line.strip()}


def test_struct_layouts_match_the_headers(tmp_path: Path) -> None:
    body = ""
    for cname, cls in S.C_NAMES.items():
        body += f'  printf("{cname}.sizeof %zu\\n", sizeof({cname}));\n'
        for field, _ in cls._fields_:
            body += f'  printf("{cname}.{field} %zu\\n", offsetof({cname}, {field}));\n'
    c = _compile_and_run(tmp_path, body)
    for cname, cls in S.C_NAMES.items():
        assert ctypes.sizeof(cls) == c[f"{cname}.sizeof"], f"sizeof({cname})"
        for field, _ in cls._fields_:
            assert getattr(cls, field).offset == c[f"{cname}.{field}"], f"offsetof({cname}, {field})"


def test_header_constants(tmp_path: Path) -> None:
    from ddplug import context, registered_memory, runonce
    from ddplug.data import audit, samplers

    c = _compile_and_run(tmp_path, """
  printf("OK %d\\n", DDPLUG_OK);
  printf("TIMEOUT_DEFAULT %lld\\n", (long long)DDPLUG_TIMEOUT_DEFAULT);
  printf("CAP_HOST %llu\\n", (unsigned long long)DDPLUG_CAP_HOST_MEMORY);
  printf("CAP_DEVICE %llu\\n", (unsigned long long)DDPLUG_CAP_DEVICE_MEMORY);
  printf("CAP_REGISTERED %llu\\n", (unsigned long long)DDPLUG_CAP_REGISTERED_MEMORY);
  printf("REACH_STAGED %d\\nREACH_SINGLE_COPY %d\\nREACH_REGISTERED %d\\n", DDPLUG_REACH_STAGED,
         DDPLUG_REACH_SINGLE_COPY, DDPLUG_REACH_REGISTERED);
  printf("SAMPLER_DISTRIBUTED %d\\n", (int)DDPLUG_SAMPLER_DISTRIBUTED);
  printf("SAMPLER_BUCKET %d\\n", (int)DDPLUG_SAMPLER_BUCKET);
  printf("SCOPE_GLOBAL %d\\n", (int)DDPLUG_SCOPE_GLOBAL);
  printf("SCOPE_NODE %d\\n", (int)DDPLUG_SCOPE_NODE);
  printf("STREAM_NAME_MAX %d\\n", (int)DDPLUG_STREAM_NAME_MAX);
  printf("OP_BIT_AVG %u\\n", DDPLUG_OP_BIT(DDPLUG_OP_AVG));
  printf("OP_AVG %d\\n", (int)DDPLUG_OP_AVG);
  printf("VERSION_3_7 %u\\n", DDPLUG_MAKE_VERSION(3, 7));
""")
    assert c["OK"] == 0 == errors.status_code("OK")
    assert c["TIMEOUT_DEFAULT"] == -1  # the Python layer passes -1 for "configured"
    assert c["CAP_HOST"] == context.CAP_HOST_MEMORY
    assert c["CAP_DEVICE"] == context.CAP_DEVICE_MEMORY
    assert c["CAP_REGISTERED"] == context.CAP_REGISTERED_MEMORY
    assert (c["REACH_STAGED"], c["REACH_SINGLE_COPY"], c["REACH_REGISTERED"]) == (
        registered_memory.REACH_STAGED, registered_memory.REACH_SINGLE_COPY, registered_memory.REACH_REGISTERED)
    assert c["SAMPLER_DISTRIBUTED"] == samplers.KIND_DISTRIBUTED
    assert c["SAMPLER_BUCKET"] == samplers.KIND_BUCKET
    assert c["SCOPE_GLOBAL"] == runonce.SCOPE_GLOBAL
    assert c["SCOPE_NODE"] == runonce.SCOPE_NODE
    assert c["STREAM_NAME_MAX"] == 63  # the rule the key table's pattern and ownership share
    assert c["OP_AVG"] == _names.ops()["avg"]
    assert c["OP_BIT_AVG"] == 1 << _names.ops()["avg"]  # how GradientSync.from_context tests op_mask
    assert c["VERSION_3_7"] == (3 << 16) | 7  # how the strategies print versions
    assert audit.verdict_name(1) == "PASS"


def test_name_tables_come_from_the_library(tmp_path: Path) -> None:
    c = _compile_and_run(tmp_path, """
#define P(name, value, str, size) printf("dtype_%s %d\\n", str, value);
  DDPLUG_DTYPE_MAP(P)
#undef P
#define P(name, value, str) printf("op_%s %d\\n", str, value);
  DDPLUG_OP_MAP(P)
#undef P
#define P(name, value, msg) printf("status_%s %d\\n", #name, value);
  DDPLUG_STATUS_MAP(P)
#undef P
  printf("owner_plugin %d\\nowner_framework %d\\nowner_user %d\\n",
         DDPLUG_OWNER_PLUGIN, DDPLUG_OWNER_FRAMEWORK, DDPLUG_OWNER_USER);
""")
    assert _names.dtypes() == {k[6:]: v for k, v in c.items() if k.startswith("dtype_")}
    assert _names.ops() == {k[3:]: v for k, v in c.items() if k.startswith("op_")}
    assert errors.status_names() == {v: k[7:] for k, v in c.items() if k.startswith("status_")}
    owners = _names.owners()
    for name in ("plugin", "framework", "user"):
        assert owners[name] == c[f"owner_{name}"]
    # every status has an exception class of its own
    for name in errors.status_names().values():
        if name != "OK":
            assert errors.class_for(name) is not errors.DdplugError, name


def test_library_version_matches_the_package() -> None:
    assert ddplug.library_version() == ddplug.__version__
    assert Path(ddplug.library_path()).name.startswith("libddplug.so")


def test_library_not_found_says_where_it_looked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bogus = tmp_path / "nowhere" / "libddplug.so.1"
    broken = tmp_path / "libddplug.so.1"
    broken.write_text("not a shared object\n" * 20)
    monkeypatch.setattr(_capi, "_lib", None)
    monkeypatch.setattr(_capi, "candidates", lambda: [("DDPLUG_LIBRARY", str(bogus)), ("build tree", str(broken))])
    with pytest.raises(_capi.LibraryNotFound) as e:
        _capi.load()
    text = str(e.value)
    assert f"DDPLUG_LIBRARY: {bogus} (no such file)" in text
    assert str(broken) in text and "invalid ELF header" in text
    assert "Set DDPLUG_LIBRARY" in text


def test_candidates_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDPLUG_LIBRARY", "/x/libddplug.so")
    monkeypatch.setenv("DDPLUG_BUILD_DIR", "/b")
    origins = [o for o, _ in _capi.candidates()]
    assert origins[0] == "DDPLUG_LIBRARY"
    assert origins.index("package") < origins.index("sys.prefix") < origins.index("DDPLUG_BUILD_DIR")
    assert origins[-1] == "source tree"


def test_config_errors_carry_position_and_class(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "plugin": "cpu",\n  "sampler": {"shufle": true}\n}\n')
    with pytest.raises(errors.ConfigError) as e:
        ddplug.Config.from_file(bad)
    assert "shufle" in str(e.value) and "shuffle" in str(e.value) and "[CONFIG]" in str(e.value)
    with pytest.raises(errors.ConfigError) as e:
        ddplug.Config.from_string('{"plugin": "cpu",}', "inline")
    assert "inline:1:" in str(e.value)


def test_config_roundtrip_and_overrides() -> None:
    from ddplug.config import load

    with load({"sampler": {"seed": 7}}) as cfg:
        assert cfg.get("sampler.seed") == 7
        assert cfg.get_int("sampler.seed") == 7
        assert cfg.get("gradients.bucket_mb") == 25
        with cfg.with_overrides({"world": {"rank": 1, "world_size": 2}}) as c2:
            assert c2.get("world.rank") == 1
            assert c2.hash() == cfg.hash()  # the world is not part of the hash
            assert c2.origin == cfg.origin


def test_unknown_function_names_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(AttributeError) as e:
        _capi.fn("ddplug_no_such_function", None, [])
    assert "does not export ddplug_no_such_function()" in str(e.value)
