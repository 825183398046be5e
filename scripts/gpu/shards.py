"""Split a model directory into parts that the device tool brings back, and join them again.

The device tool returns at most 8 files of at most 16 MiB each from ``$OUT``
(/work/.library/device/README.md); a model's fp16 weights of up to 60 MB need several. ``split``
packs the directory into one uncompressed tar (fp16 weights do not compress), cuts it into
``NAME.tar.partNN`` files of at most ``--part-mib`` MiB and writes ``NAME.manifest.json`` (each
part's and the tar's size and SHA-256, and the files inside). ``join`` checks every part against
the manifest, reassembles the tar, checks it, and unpacks the model directory.

Usage::

    python scripts/gpu/shards.py split MODEL_DIR OUT_DIR [--name model] [--part-mib 15]
    python scripts/gpu/shards.py join PARTS_DIR DEST_PARENT [--name model]

``join`` writes ``DEST_PARENT/<the model directory's name>`` and prints its path. A missing,
truncated or altered part, or an existing destination, is an error naming the file (exit 2).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

from fadat.errors import InputError

MIB = 2**20


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split(model_dir: str | Path, out_dir: str | Path, name: str = "model", part_mib: float = 15):
    """Write ``NAME.tar.partNN`` (each ≤ ``part_mib`` MiB) and ``NAME.manifest.json`` into
    ``out_dir`` from the files of ``model_dir`` (not recursive: a model directory is flat).

    Returns:
        the manifest (dict).

    Raises:
        InputError: ``model_dir`` is not a directory or holds a subdirectory.
    """
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if not model_dir.is_dir():
        raise InputError(f"{model_dir}: not a directory")
    files = sorted(model_dir.iterdir())
    nested = [f.name for f in files if f.is_dir()]
    if nested:
        raise InputError(f"{model_dir}: holds directories {nested}; a model directory is flat")
    part_bytes = int(part_mib * MIB)
    if part_bytes < 1:
        raise InputError(f"--part-mib must be positive, got {part_mib}")
    buffer = io.BytesIO()
    contents = []
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for f in files:
            data = f.read_bytes()
            info = tarfile.TarInfo(f"{model_dir.name}/{f.name}")
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
            contents.append({"name": f.name, "bytes": len(data), "sha256": sha256(data)})
    blob = buffer.getvalue()
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for k, start in enumerate(range(0, len(blob), part_bytes)):
        chunk = blob[start : start + part_bytes]
        part = f"{name}.tar.part{k:02d}"
        (out_dir / part).write_bytes(chunk)
        parts.append({"name": part, "bytes": len(chunk), "sha256": sha256(chunk)})
    manifest = {
        "model_dir": model_dir.name,
        "tar_bytes": len(blob),
        "tar_sha256": sha256(blob),
        "parts": parts,
        "contents": contents,
    }
    path = out_dir / f"{name}.manifest.json"
    path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def join(parts_dir: str | Path, dest_parent: str | Path, name: str = "model") -> Path:
    """Check the parts in ``parts_dir`` against ``NAME.manifest.json`` and unpack the model
    directory into ``dest_parent``.

    Returns:
        the model directory written.

    Raises:
        InputError: no manifest, a part missing or differing from the manifest (size or
            SHA-256), the reassembled tar or a file in it differing, or the destination exists.
    """
    parts_dir, dest_parent = Path(parts_dir), Path(dest_parent)
    manifest_path = parts_dir / f"{name}.manifest.json"
    if not manifest_path.is_file():
        raise InputError(f"{manifest_path}: no such manifest (written by shards.py split)")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    chunks = []
    for part in manifest["parts"]:
        path = parts_dir / part["name"]
        if not path.is_file():
            raise InputError(f"{path}: part missing ({len(manifest['parts'])} parts expected)")
        data = path.read_bytes()
        if len(data) != part["bytes"] or sha256(data) != part["sha256"]:
            raise InputError(
                f"{path}: {len(data)} bytes, SHA-256 {sha256(data)[:12]}…; the manifest says "
                f"{part['bytes']} bytes, {part['sha256'][:12]}… (damaged or from another run)"
            )
        chunks.append(data)
    blob = b"".join(chunks)
    if sha256(blob) != manifest["tar_sha256"]:
        raise InputError(f"{manifest_path}: the parts join into a tar whose SHA-256 differs")
    dest = dest_parent / manifest["model_dir"]
    if dest.exists():
        raise InputError(f"{dest}: exists; remove it or choose another destination")
    dest_parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        # "data" refuses absolute paths, links and paths that leave dest_parent
        tar.extractall(dest_parent, filter="data")
    for item in manifest["contents"]:
        data = (dest / item["name"]).read_bytes()
        if sha256(data) != item["sha256"]:
            raise InputError(f"{dest / item['name']}: SHA-256 differs from the manifest")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split", help="model directory -> parts + manifest")
    s.add_argument("model_dir")
    s.add_argument("out_dir")
    s.add_argument("--name", default="model")
    s.add_argument("--part-mib", type=float, default=15.0)
    j = sub.add_parser("join", help="parts + manifest -> model directory")
    j.add_argument("parts_dir")
    j.add_argument("dest_parent")
    j.add_argument("--name", default="model")
    args = parser.parse_args(argv)
    try:
        if args.command == "split":
            m = split(args.model_dir, args.out_dir, args.name, args.part_mib)
            print(
                f"{args.model_dir}: {m['tar_bytes'] / MIB:.1f} MiB in {len(m['parts'])} parts "
                f"of <= {args.part_mib:g} MiB -> {args.out_dir}"
            )
        else:
            print(join(args.parts_dir, args.dest_parent, args.name))
    except InputError as err:
        print(f"shards.py: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
