"""Generate the Python stubs of the internal contracts from ``protos/``.

``python -m rocketstore.protogen`` regenerates ``rocketstore/v1/*_pb2.py``, ``*_pb2_grpc.py`` and
``*_pb2.pyi`` from every ``protos/rocketstore/v1/*.proto`` with grpcio-tools (``-I protos``, so the
generated modules import each other as ``from rocketstore.v1 import x_pb2``), and ``*_pb2_grpc.pyi``
with mypy-protobuf's ``protoc-gen-mypy_grpc`` plugin: grpcio-tools writes the stubs and servicers
untyped, and the type checker needs their request and response types. The stubs are
committed; ``python -m rocketstore.protogen --check`` regenerates them into a temporary directory
and exits 1, listing every stale, missing or orphaned stub, when the committed ones differ.

The comparison ignores the grpcio-tools / protobuf version stamps that protoc writes into the
stubs, so a newer grpcio-tools alone does not make the stubs stale; only a contract change does.
"""

from __future__ import annotations

import argparse
import importlib.resources
import re
import shutil
import sys
import tempfile
from pathlib import Path

PACKAGE_PATH = Path("rocketstore") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi", "_pb2_grpc.pyi")
GRPC_TYPES_PLUGIN = "protoc-gen-mypy_grpc"

_ROOT = Path(__file__).resolve().parent.parent

# protoc stamps its own version into the stubs; these lines are masked before comparing.
_VERSION_STAMPS = (
    (re.compile(r"^# Protobuf Python Version: .*$", re.M), "# Protobuf Python Version: X"),
    (re.compile(r"^GRPC_GENERATED_VERSION = .*$", re.M), "GRPC_GENERATED_VERSION = X"),
    (
        re.compile(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*\d+,\s*\d+,\s*\d+,\s*'[^']*',"),
        "ValidateProtobufRuntimeVersion(X,",
    ),
)


class ProtogenError(RuntimeError):
    """protoc failed (the message holds its output) or there was nothing to compile."""


def default_protos_dir() -> Path:
    return _ROOT / "protos"


def default_out_dir() -> Path:
    """The directory that holds the ``rocketstore`` package (the stubs land in rocketstore/v1)."""
    return _ROOT


def grpc_types_plugin() -> Path:
    """The mypy-protobuf plugin that writes ``*_pb2_grpc.pyi``: beside this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / GRPC_TYPES_PLUGIN
    if beside.is_file():
        return beside
    found = shutil.which(GRPC_TYPES_PLUGIN)
    if found is None:
        raise ProtogenError(f"{GRPC_TYPES_PLUGIN} not found: install mypy-protobuf (pip install -e '.[test]')")
    return Path(found)


def proto_files(protos_dir: Path) -> list[Path]:
    """Every .proto of the rocketstore.v1 package, sorted, relative to ``protos_dir``."""
    return sorted(p.relative_to(protos_dir) for p in (protos_dir / PACKAGE_PATH).glob("*.proto"))


def generate(protos_dir: Path | None = None, out_dir: Path | None = None) -> list[Path]:
    """Compile every proto into ``out_dir/rocketstore/v1``; returns the files written."""
    from grpc_tools import protoc

    plugin = grpc_types_plugin()
    protos_dir = (protos_dir or default_protos_dir()).resolve()
    out_dir = (out_dir or default_out_dir()).resolve()
    files = proto_files(protos_dir)
    if not files:
        raise ProtogenError(f"no .proto files in {protos_dir / PACKAGE_PATH}")
    (out_dir / PACKAGE_PATH).mkdir(parents=True, exist_ok=True)
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{protos_dir}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--plugin={GRPC_TYPES_PLUGIN}={plugin}",
        f"--mypy_grpc_out=quiet:{out_dir}",
        # absolute paths under the -I directory: protoc names them rocketstore/v1/x.proto
        *(str(protos_dir / f) for f in files),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise ProtogenError(f"protoc failed with exit code {rc} for {', '.join(map(str, files))}")
    written = []
    for f in files:
        stem = f.with_suffix("").name
        written += [out_dir / PACKAGE_PATH / f"{stem}{suffix}" for suffix in GENERATED_SUFFIXES]
    return written


def _normalise(text: str) -> str:
    for pattern, replacement in _VERSION_STAMPS:
        text = pattern.sub(replacement, text)
    return text


def check(protos_dir: Path | None = None, out_dir: Path | None = None) -> list[str]:
    """Compare the committed stubs with freshly generated ones.

    Returns one line per problem (``stale: ...``, ``missing: ...``, ``orphaned: ...``); an empty
    list means the stubs are up to date."""
    protos_dir = (protos_dir or default_protos_dir()).resolve()
    out_dir = (out_dir or default_out_dir()).resolve()
    committed_dir = out_dir / PACKAGE_PATH
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="rocketstore-protogen-") as tmp:
        fresh = generate(protos_dir, Path(tmp))
        expected_names = set()
        for path in fresh:
            expected_names.add(path.name)
            committed = committed_dir / path.name
            if not committed.exists():
                problems.append(f"missing: {committed}")
            elif _normalise(committed.read_text()) != _normalise(path.read_text()):
                problems.append(f"stale: {committed}")
    for path in sorted(committed_dir.iterdir()) if committed_dir.is_dir() else []:
        if path.name.endswith(GENERATED_SUFFIXES) and path.name not in expected_names:
            problems.append(f"orphaned (no .proto): {path}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rocketstore.protogen",
        description="Regenerate (or check) the rocketstore.v1 Python stubs from protos/.",
    )
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 and list the stubs that are stale or missing")
    parser.add_argument("--protos", type=Path, default=None, help="the protos directory (default: ./protos)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the directory holding the rocketstore package (default: the source tree)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = check(args.protos, args.out)
            for line in problems:
                print(line, file=sys.stderr)
            if problems:
                print("stubs are out of date: run `python -m rocketstore.protogen`", file=sys.stderr)
                return 1
            print("stubs are up to date")
            return 0
        for path in generate(args.protos, args.out):
            print(f"wrote {path}")
        return 0
    except ProtogenError as e:
        print(f"protogen: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
