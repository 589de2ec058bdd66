"""One golden on disk: the deterministic bytes (zip of .npy members, JSON text), the environment
it records (`made_with`), and rendering, writing and loading one golden."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import platform as _pyplatform
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from specverify import dtypes
from specverify.golden.errors import (RULES, GoldenCorrupt, GoldenFieldMissing, GoldenMissing,
                                      GoldenVersionUnknown, check_name, golden_paths)
from specverify.golden.trees import _decode, _float_node, encode

FORMAT = "specverify-golden"
FORMAT_VERSION = 1
VERSION_KEYS = ("torch", "triton", "numpy", "python")


# ---------------------------------------------------------------------------------------------
# deterministic bytes: the zip writer, the JSON writer

_DOS_DATE = (0 << 9) | (1 << 5) | 1          # 1980-01-01
_DOS_TIME = 0


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.array(arr, copy=True, order="C"), version=(1, 0), allow_pickle=False)
    return buf.getvalue()


def _zip_stored(members: list[tuple[str, bytes]]) -> bytes:
    """A zip of uncompressed members: fixed time stamps, attributes and order (no zip64)."""
    out, central = io.BytesIO(), io.BytesIO()
    for name, data in members:
        raw = name.encode("ascii")
        crc = zlib.crc32(data) & 0xFFFFFFFF
        if len(data) >= 0xFFFFFFFF or out.tell() >= 0xFFFFFFFF:
            raise ValueError(f"golden npz member {name} is too large for a plain zip")
        offset = out.tell()
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, _DOS_TIME, _DOS_DATE, crc, len(data), len(data),
                              len(raw), 0))
        out.write(raw)
        out.write(data)
        central.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, (3 << 8) | 20, 20, 0, 0, _DOS_TIME, _DOS_DATE,
                                  crc, len(data), len(data), len(raw), 0, 0, 0, 0, 0o100644 << 16, offset))
        central.write(raw)
    if len(members) >= 0xFFFF:
        raise ValueError(f"golden npz has {len(members)} members, more than a plain zip holds")
    cd = central.getvalue()
    start = out.tell()
    out.write(cd)
    out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(cd), start, 0))
    return out.getvalue()


_INLINE = 100     # a container whose one-line form is at most this long stays on one line


def _json_text(x, indent: int = 0) -> str:
    """Sorted keys; short containers and lists of scalars on one line; floats in their exact
    repr; NaN refused."""
    pad = " " * indent
    if isinstance(x, (dict, list)):
        line = json.dumps(x, sort_keys=True, allow_nan=False, separators=(", ", ": "))
        if len(line) <= _INLINE:
            return line
    if isinstance(x, dict):
        if not x:
            return "{}"
        items = [f"{pad} {json.dumps(str(k))}: {_json_text(x[k], indent + 1)}" for k in sorted(x)]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(x, list):
        if all(not isinstance(v, (dict, list)) for v in x):
            return "[" + ", ".join(json.dumps(v, allow_nan=False) for v in x) + "]"
        return "[\n" + ",\n".join(f"{pad} {_json_text(v, indent + 1)}" for v in x) + f"\n{pad}]"
    return json.dumps(x, allow_nan=False)


def dump_json(doc) -> bytes:
    return (_json_text(doc) + "\n").encode("ascii")


def _read_npz(path: Path, name: str, root) -> dict[str, np.ndarray]:
    arrays = {}
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if not info.filename.endswith(".npy"):
                    raise ValueError(f"member {info.filename!r} is not an .npy array")
                data = z.read(info)        # checks the CRC
                arrays[info.filename[:-4]] = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    except FileNotFoundError:
        raise GoldenMissing(path, "missing (the npz of this golden)", name, root) from None
    except (zipfile.BadZipFile, ValueError, EOFError, OSError, struct.error) as e:
        raise GoldenCorrupt(path, f"corrupted or truncated npz ({type(e).__name__}: {e})", name, root) from None
    return arrays


# ---------------------------------------------------------------------------------------------
# environment (made_with)


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:     # not installed (triton on some machines)
        return "absent"


@functools.lru_cache(maxsize=1)
def _versions() -> tuple[tuple[str, str], ...]:
    return (("torch", str(torch.__version__)), ("triton", _version("triton")), ("numpy", str(np.__version__)),
            ("python", _pyplatform.python_version()))


def environment(profile=None) -> dict:
    """Library versions and the platform: what `made_with` records (no time, no host name)."""
    from specverify.platform import get_profile, native_platform
    profile = get_profile() if profile is None else profile
    return {**dict(_versions()), "profile": profile.name, "device": profile.device,
            "native_platform": native_platform()}


def version_notes(made_with: Mapping, running: Mapping | None = None) -> list[str]:
    """One line per library whose version differs from the running one."""
    running = environment() if running is None else running
    return [f"made with {k} {made_with.get(k, '?')}, running {running.get(k)} — compared anyway"
            for k in VERSION_KEYS if made_with.get(k) != running.get(k)]


# ---------------------------------------------------------------------------------------------
# one golden: render, write, load


@dataclasses.dataclass
class Golden:
    name: str
    path: Path                  # the JSON file
    inputs: Any
    outputs: Any
    meta: dict
    made_with: dict
    rules: dict
    tolerance_dtype: str


def tolerance_entry(tolerance_dtype: str) -> dict:
    tol = dtypes.TOLERANCES[tolerance_dtype]
    return {"dtype": tolerance_dtype, "atol": float(tol.atol), "rtol": float(tol.rtol)}


def _meta_json(meta, where: str):
    """Catalogue metadata as plain JSON (str-keyed dicts, lists, str, int, float, bool, None)."""
    if meta is None or isinstance(meta, (bool, str)):
        return meta
    if isinstance(meta, (int, np.integer)) and not isinstance(meta, np.bool_):
        return int(meta)
    if isinstance(meta, (float, np.floating)):
        return _float_node(float(meta))
    if isinstance(meta, (list, tuple)):
        return [_meta_json(v, where) for v in meta]
    if isinstance(meta, Mapping):
        bad = [k for k in meta if not isinstance(k, str)]
        if bad:
            raise TypeError(f"golden {where}: meta keys must be str, got {bad[:3]}")
        return {k: _meta_json(v, where) for k, v in meta.items()}
    raise TypeError(f"golden {where}: meta values must be JSON values, got a {type(meta).__name__}")


def render(name: str, inputs, outputs, meta: Mapping, rules: Mapping, tolerance_dtype: str, made_with: Mapping,
           extra: Mapping | None = None) -> tuple[bytes, bytes]:
    """(json bytes, npz bytes) of a golden; a pure function of its arguments."""
    check_name(name)
    for key in ("rules", "tolerance"):
        if key in meta:
            raise ValueError(f"golden {name}: meta key {key!r} is written by the tool, not the catalogue")
    in_skel, in_arr = encode(inputs, "inputs")
    out_skel, out_arr = encode(outputs, "outputs")
    npz = _zip_stored([(f"{k}.npy", _npy_bytes(v)) for k, v in {**in_arr, **out_arr}.items()])
    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "name": name, "made_with": dict(made_with),
           "meta": {**_meta_json(meta, name), "rules": dict(sorted(rules.items())),
                    "tolerance": tolerance_entry(tolerance_dtype)},
           "inputs": in_skel, "outputs": out_skel,
           "npz": {"sha256": hashlib.sha256(npz).hexdigest(), "arrays": len(in_arr) + len(out_arr)}}
    if extra:
        doc.update(extra)
    return dump_json(doc), npz


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


_REQUIRED = ("format", "format_version", "name", "made_with", "meta", "inputs", "outputs", "npz")


def _read_doc(path: Path, name: str, root) -> dict:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise GoldenMissing(path, "missing", name, root) from None
    try:
        doc = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GoldenCorrupt(path, f"not valid JSON, corrupted or truncated ({e})", name, root) from None
    if not isinstance(doc, dict):
        raise GoldenCorrupt(path, f"holds a JSON {type(doc).__name__}, not a golden object", name, root)
    if doc.get("format") != FORMAT:
        raise GoldenCorrupt(path, f"format tag {doc.get('format')!r}, expected {FORMAT!r}", name, root)
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise GoldenVersionUnknown(path, f"format version {version!r} is unknown to this specverify (it reads "
                                         f"version {FORMAT_VERSION})", name, root)
    return doc


def load_golden(root, name: str) -> Golden:
    """Read golden `name` from `root`; a GoldenError naming the file and the regen command otherwise."""
    jpath, zpath = golden_paths(root, name)
    doc = _read_doc(jpath, name, root)
    missing = [f for f in _REQUIRED if f not in doc]
    if missing:
        raise GoldenFieldMissing(jpath, f"field {missing[0]!r} missing", name, root)
    for f in ("made_with", "meta", "npz"):
        if not isinstance(doc[f], dict):
            raise GoldenCorrupt(jpath, f"field {f!r} is a {type(doc[f]).__name__}, not an object", name, root)
    meta = doc["meta"]
    for f in ("rules", "tolerance"):
        if not isinstance(meta, dict) or f not in meta:
            raise GoldenFieldMissing(jpath, f"field 'meta.{f}' missing", name, root)
    if doc["name"] != name:
        raise GoldenCorrupt(jpath, f"holds golden {doc['name']!r}, expected {name!r}", name, root)
    tol = meta["tolerance"]
    if not isinstance(tol, dict) or tol.get("dtype") not in dtypes.TOLERANCES:
        raise GoldenCorrupt(jpath, f"meta.tolerance {tol!r} names no dtype of the tolerance table", name, root)
    rules = meta["rules"]
    if not isinstance(rules, dict) or any(v not in RULES for v in rules.values()):
        raise GoldenCorrupt(jpath, f"meta.rules {rules!r}: every rule must be one of {RULES}", name, root)
    try:
        raw = zpath.read_bytes()
    except FileNotFoundError:
        raise GoldenMissing(zpath, "missing (the npz of this golden)", name, root) from None
    if hashlib.sha256(raw).hexdigest() != doc["npz"].get("sha256"):
        raise GoldenCorrupt(zpath, f"sha256 {hashlib.sha256(raw).hexdigest()[:16]}... is not the "
                                   f"{str(doc['npz'].get('sha256'))[:16]}... its JSON records (corrupted, truncated "
                                   f"or from another regeneration)", name, root)
    arrays = _read_npz(zpath, name, root)
    try:
        inputs, used_in = _decode(doc["inputs"], arrays, str(jpath))
        outputs, used_out = _decode(doc["outputs"], arrays, str(jpath))
    except ValueError as e:
        raise GoldenCorrupt(jpath, str(e).removeprefix(f"{jpath}: "), name, root) from None
    extra = sorted(set(arrays) - used_in - used_out)
    if extra:
        raise GoldenCorrupt(zpath, f"holds arrays its JSON does not use: {extra[:5]}", name, root)
    return Golden(name, jpath, inputs, outputs, meta, doc["made_with"], dict(rules), tol["dtype"])
