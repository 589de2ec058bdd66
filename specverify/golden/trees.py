"""Trees <-> (JSON skeleton, arrays): the exact encoding of a golden's inputs and outputs."""

from __future__ import annotations

import math
import struct
from typing import Any, Mapping

import numpy as np
import torch

_NATIVE = {torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16,
           torch.int32: np.int32, torch.int64: np.int64, torch.float16: np.float16, torch.float32: np.float32,
           torch.float64: np.float64, torch.complex64: np.complex64, torch.complex128: np.complex128}
_BITS = {1: (torch.uint8, np.uint8), 2: (torch.int16, np.int16), 4: (torch.int32, np.int32),
         8: (torch.int64, np.int64)}
_ARRAY_KINDS = "biufc"


def _torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dt


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _float_node(x: float):
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return {"$float": "nan", "bits": struct.pack(">d", x).hex()}
    return {"$float": "inf" if x > 0 else "-inf"}


def encode(tree, prefix: str = "a") -> tuple[Any, dict[str, np.ndarray]]:
    """(JSON skeleton, {member name: array}) of a tree; exact for every supported leaf kind."""
    arrays: dict[str, np.ndarray] = {}

    def put(arr: np.ndarray) -> str:
        key = f"{prefix}.{len(arrays)}"
        arrays[key] = np.array(arr, copy=True, order="C")
        return key

    def enc(x, path: str):
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return int(x)
        if isinstance(x, float):
            return _float_node(float(x))
        if isinstance(x, torch.Tensor):
            t = x.detach()
            if t.layout != torch.strided or t.is_quantized:
                raise TypeError(f"golden: cannot store a {t.layout} / quantized tensor at {path or 'the root'}")
            t = t.to("cpu").contiguous()
            if t.dtype in _NATIVE:
                arr = t.numpy()
            elif t.element_size() in _BITS:
                arr = t.view(_BITS[t.element_size()][0]).numpy()
            else:
                raise TypeError(f"golden: cannot store a {t.dtype} tensor at {path or 'the root'}")
            return {"$tensor": {"dtype": _dtype_name(t.dtype), "shape": list(t.shape), "array": put(arr)}}
        if isinstance(x, np.ndarray):
            if x.dtype.kind not in _ARRAY_KINDS:
                raise TypeError(f"golden: cannot store a numpy array of dtype {x.dtype} at {path or 'the root'}")
            return {"$ndarray": {"dtype": x.dtype.str, "shape": list(x.shape), "array": put(x)}}
        if isinstance(x, np.generic):
            if np.dtype(x.dtype).kind not in _ARRAY_KINDS:
                raise TypeError(f"golden: cannot store a numpy scalar of dtype {x.dtype} at {path or 'the root'}")
            return {"$npscalar": {"dtype": x.dtype.str, "array": put(np.array(x))}}
        if isinstance(x, bytes):
            return {"$bytes": x.hex()}
        if isinstance(x, list):
            return [enc(v, f"{path}[{i}]") for i, v in enumerate(x)]
        if isinstance(x, tuple):
            return {"$tuple": [enc(v, f"{path}[{i}]") for i, v in enumerate(x)]}
        if isinstance(x, dict):
            if all(isinstance(k, str) for k in x):
                body = {k: enc(v, _join(path, k)) for k, v in x.items()}
                return {"$dict": body} if list(x) == sorted(x) else {"$dict": body, "order": list(x)}
            return {"$pairs": [[enc(k, f"{path}<key>"), enc(v, _join(path, k))] for k, v in x.items()]}
        raise TypeError(f"golden: cannot store a {type(x).__name__} at {path or 'the root'}")

    return enc(tree, ""), arrays


def decode(skeleton, arrays: Mapping[str, np.ndarray], where: str = "golden") -> Any:
    """The tree `encode` made; ValueError naming the node for anything malformed."""
    return _decode(skeleton, arrays, where)[0]


def _decode(skeleton, arrays: Mapping[str, np.ndarray], where: str) -> tuple[Any, set[str]]:
    """(tree, names of the arrays it uses)."""
    used: set[str] = set()

    def array(key, path):
        if not isinstance(key, str) or key not in arrays:
            raise ValueError(f"{where}: {path or 'the root'} names array {key!r}, which the npz does not hold")
        used.add(key)
        return arrays[key]

    def dec(x, path: str):
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [dec(v, f"{path}[{i}]") for i, v in enumerate(x)]
        if not isinstance(x, dict) or len(x) != 1 and not ("$float" in x or "$dict" in x) or len(x) > 2:
            raise ValueError(f"{where}: malformed node at {path or 'the root'}: {str(x)[:80]}")
        tag = next(iter(k for k in x if k.startswith("$")), None)
        body = x.get(tag)
        try:
            if tag == "$tensor":
                dt = _torch_dtype(body["dtype"])
                arr = array(body["array"], path)
                if list(arr.shape) != list(body["shape"]):
                    raise ValueError(f"array shape {arr.shape}, the JSON says {body['shape']}")
                if dt in _NATIVE:
                    want = np.dtype(_NATIVE[dt])
                else:
                    want = np.dtype(_BITS[torch.empty((), dtype=dt).element_size()][1])
                if arr.dtype != want:
                    raise ValueError(f"array dtype {arr.dtype}, {body['dtype']} is stored as {want}")
                t = torch.from_numpy(np.array(arr, copy=True))
                return t if dt in _NATIVE else t.view(dt)
            if tag == "$ndarray":
                arr = array(body["array"], path)
                if arr.dtype.str != body["dtype"] or list(arr.shape) != list(body["shape"]):
                    raise ValueError(f"array {arr.dtype.str} {list(arr.shape)}, the JSON says {body['dtype']} "
                                     f"{body['shape']}")
                return np.array(arr, copy=True)
            if tag == "$npscalar":
                arr = array(body["array"], path)
                if arr.dtype.str != body["dtype"] or arr.shape != ():
                    raise ValueError(f"scalar array {arr.dtype.str} {arr.shape}, the JSON says {body['dtype']}")
                return arr[()]
            if tag == "$float":
                if body == "nan":
                    return struct.unpack(">d", bytes.fromhex(x["bits"]))[0]
                return {"inf": math.inf, "-inf": -math.inf}[body]
            if tag == "$bytes":
                return bytes.fromhex(body)
            if tag == "$tuple":
                return tuple(dec(v, f"{path}[{i}]") for i, v in enumerate(body))
            if tag == "$dict":
                order = x.get("order", sorted(body) if isinstance(body, dict) else [])
                if not isinstance(body, dict) or sorted(order) != sorted(body):
                    raise ValueError(f"$dict keys {sorted(body)[:5]} do not match its order {order[:5]}")
                return {k: dec(body[k], _join(path, k)) for k in order}
            if tag == "$pairs":
                out = {}
                for pair in body:
                    k, v = pair
                    k = dec(k, f"{path}<key>")
                    out[k] = dec(v, _join(path, k))
                return out
        except ValueError as e:
            if str(e).startswith(where):
                raise
            raise ValueError(f"{where}: {path or 'the root'}: {e}") from None
        except (KeyError, TypeError, IndexError) as e:
            raise ValueError(f"{where}: malformed {tag} node at {path or 'the root'} ({type(e).__name__}: {e})") \
                from None
        raise ValueError(f"{where}: unknown node {tag!r} at {path or 'the root'}")

    out = dec(skeleton, "")
    return out, used


def _join(path: str, key) -> str:
    return f"{path}.{key}" if path else str(key)
