"""Generate the Python stubs of the gRPC contracts from ``protos/``.

``python -m rocketstore.protogen`` regenerates ``*_pb2.py``, ``*_pb2_grpc.py`` and ``*_pb2.pyi`` with
grpcio-tools (``-I protos``), and ``*_pb2_grpc.pyi`` with mypy-protobuf's ``protoc-gen-mypy_grpc``
plugin (grpcio-tools writes the stubs and servicers untyped, and the type checker needs their request
and response types), for each package of ``PACKAGES``:

* ``protos/rocketstore/v1/*.proto`` (the internal contracts) into ``rocketstore/v1``;
* ``protos/apache/rocketmq/v2/*.proto`` (RocketMQ 5's published ``apache.rocketmq.v2`` protocol, copied
  from apache/rocketmq-apis) into ``rocketstore/v2``: the modules' imports and names are moved from
  ``apache.rocketmq.v2`` to ``rocketstore.v2``, while the proto files, packages and method paths on the
  wire stay the published ones.

The stubs are committed; ``python -m rocketstore.protogen --check`` regenerates them into a temporary
directory and exits 1, listing every stale, missing or orphaned stub, when the committed ones differ.

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
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StubPackage:
    """The protos under ``protos/<proto_path>`` and the Python package ``<package_path>`` of their stubs."""

    proto_path: Path
    package_path: Path

    @property
    def renamed(self) -> bool:
        return self.proto_path != self.package_path

    def rename(self, text: str) -> str:
        """Generated text with the proto package's modules named as the Python package's: only module
        references (``from a.b import x_pb2``, ``a.b.x_pb2``), never the wire names in descriptors."""
        if not self.renamed:
            return text
        old, new = ".".join(self.proto_path.parts), ".".join(self.package_path.parts)
        text = re.sub(rf"^from {re.escape(old)} import ", f"from {new} import ", text, flags=re.M)
        return re.sub(rf"\b{re.escape(old)}\.(?=\w+_pb2\b)", f"{new}.", text)


PACKAGE_PATH = Path("rocketstore") / "v1"
V1 = StubPackage(PACKAGE_PATH, PACKAGE_PATH)
V2 = StubPackage(Path("apache") / "rocketmq" / "v2", Path("rocketstore") / "v2")
PACKAGES = (V1, V2)
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
    """The directory that holds the ``rocketstore`` package (the stubs land in rocketstore/v1 and v2)."""
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


def proto_files(protos_dir: Path, package: StubPackage = V1) -> list[Path]:
    """Every .proto of ``package`` (rocketstore.v1 unless told), sorted, relative to ``protos_dir``."""
    return sorted(p.relative_to(protos_dir) for p in (protos_dir / package.proto_path).glob("*.proto"))


def generate(protos_dir: Path | None = None, out_dir: Path | None = None) -> list[Path]:
    """Compile every proto of every package into ``out_dir/<package path>``; returns the files written."""
    from grpc_tools import protoc

    plugin = grpc_types_plugin()
    protos_dir = (protos_dir or default_protos_dir()).resolve()
    out_dir = (out_dir or default_out_dir()).resolve()
    files = {package: proto_files(protos_dir, package) for package in PACKAGES}
    for package, found in files.items():
        if not found:
            raise ProtogenError(f"no .proto files in {protos_dir / package.proto_path}")
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    written = []
    with tempfile.TemporaryDirectory(prefix="rocketstore-protoc-") as tmp:
        staging = Path(tmp)
        args = [
            "grpc_tools.protoc",
            f"-I{protos_dir}",
            f"-I{well_known}",
            f"--python_out={staging}",
            f"--pyi_out={staging}",
            f"--grpc_python_out={staging}",
            f"--plugin={GRPC_TYPES_PLUGIN}={plugin}",
            f"--mypy_grpc_out=quiet:{staging}",
            # absolute paths under the -I directory: protoc names them rocketstore/v1/x.proto, ...
            *(str(protos_dir / f) for found in files.values() for f in found),
        ]
        rc = protoc.main(args)
        if rc != 0:
            names = ", ".join(str(f) for found in files.values() for f in found)
            raise ProtogenError(f"protoc failed with exit code {rc} for {names}")
        for package, found in files.items():
            (out_dir / package.package_path).mkdir(parents=True, exist_ok=True)
            for f in found:
                stem = f.with_suffix("").name
                for suffix in GENERATED_SUFFIXES:
                    source = staging / package.proto_path / f"{stem}{suffix}"
                    target = out_dir / package.package_path / f"{stem}{suffix}"
                    target.write_text(package.rename(source.read_text()))
                    written.append(target)
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
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="rocketstore-protogen-") as tmp:
        fresh_root = Path(tmp)
        fresh = generate(protos_dir, fresh_root)
        expected = set()
        for path in fresh:
            relative = path.relative_to(fresh_root)
            expected.add(relative)
            committed = out_dir / relative
            if not committed.exists():
                problems.append(f"missing: {committed}")
            elif _normalise(committed.read_text()) != _normalise(path.read_text()):
                problems.append(f"stale: {committed}")
    for package in PACKAGES:
        committed_dir = out_dir / package.package_path
        for path in sorted(committed_dir.iterdir()) if committed_dir.is_dir() else []:
            if path.name.endswith(GENERATED_SUFFIXES) and path.relative_to(out_dir) not in expected:
                problems.append(f"orphaned (no .proto): {path}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rocketstore.protogen",
        description="Regenerate (or check) the rocketstore.v1 and rocketstore.v2 Python stubs from protos/.",
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
