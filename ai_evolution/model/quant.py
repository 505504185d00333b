"""Weight-only quantization of a ``Transformer``'s linear layers, in plain PyTorch (chapter 7).

Formats (``model.memory.WeightFormat``; the byte arithmetic lives there):

- ``int8``: symmetric, one scale per output channel: ``scale = max|row| / 127``,
  ``q = round(w / scale)`` in [-127, 127], ``w ~ q x scale``.
- ``int4`` (``int4-g32``/``-g64``/``-g128``): symmetric, one scale per group of ``group_size``
  consecutive inputs of a row: ``scale = max|group| / 7``, ``q = round(w / scale)`` in [-8, 7],
  stored as ``u = q + 8`` in [0, 15].
- ``int4-asym``: per group, ``zero = min(group)`` and ``scale = (max - min) / 15``,
  ``u = round((w - zero) / scale)`` in [0, 15], ``w ~ zero + u x scale`` (the "zero" is the value
  the integer 0 stands for, a float, as in the tinygemm kernels).

Two 4-bit integers share a byte: column ``2j`` in the high nibble, ``2j + 1`` in the low one
(the layout ``torch._convert_weight_to_int4pack`` takes). Scales and zeros are stored in the
model's floating dtype and are computed so that every weight is within ``scale / 2`` of its
dequantized value (plus the rounding of the scale itself when that dtype is bf16/fp16).

``QuantizedLinear`` replaces ``nn.Linear``. Its ``backend`` is ``"reference"`` (dequantize the
whole matrix, then ``F.linear``) or ``"fast"`` (a fused torch kernel where this torch and device
have one, otherwise the reference path): on CPU, with bf16 activations, ``_weight_int8pack_mm``
and ``_weight_int4pack_mm_for_cpu``; on CUDA, ``_weight_int8pack_mm`` where this torch has it and
the tinygemm ``_weight_int4pack_mm`` (sm80 or newer, bf16 activations). On CPU the fp32 and fp16
variants of those kernels are not vectorized (scalar loops, several times slower than
dequantize-then-matmul on the machine this was written on), so "fast" does not pick them; they
stay reachable through ``forward_with`` for measurement. Each fused kernel is probed once per
(kernel, device, dtype) against the reference on a seeded layer before "fast" uses it, and
``kernel()`` names the path a layer takes. Fused kernel and reference agree within
``FAST_PATH_RTOL[dtype]`` of the largest output (``max|fast - ref| <= rtol x max|ref|``).

KV-cache quantization is not here (the KV store is being refactored; see issue 20).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .memory import WeightFormat, parse_weight_format

BACKENDS = ("reference", "fast")
KERNELS = ("dequant-matmul", "int8pack-mm", "int4pack-mm-cpu", "int4pack-mm-cuda")
# Fast path vs reference: max|fast - ref| <= rtol x max|ref| (seeded layers, tests/test_quant.py).
# fp32: the kernels accumulate in another order (measured ~1e-6); bf16/fp16: the reference rounds
# the dequantized matrix to the activation dtype and the kernels do not (measured ~3e-3 in bf16).
FAST_PATH_RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}
_INT4_KERNEL_GROUPS = (32, 64, 128, 256)  # what both int4 kernels accept
_N_ALIGN = 16  # the int4 kernels want out_features a multiple of 16: pad, then slice


# --- tensors -------------------------------------------------------------------------------------

def _check_weight(w: Tensor, what: str = "el peso") -> None:
    if not isinstance(w, Tensor) or w.dim() != 2 or not w.is_floating_point():
        got = (f"forma {tuple(w.shape)}, {w.dtype}" if isinstance(w, Tensor)
               else type(w).__name__)
        raise ValueError(f"{what} debe ser una matriz [out_features, in_features] de coma "
                         f"flotante; se recibió {got}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"{what} contiene valores no finitos (NaN o infinito): no se puede "
                         f"cuantizar")


def _safe(s: Tensor) -> Tensor:
    """A divisor: a zero scale (all-zero row or constant group) divides by 1, giving q = 0."""
    return torch.where(s == 0, torch.ones_like(s), s)


def quantize_int8(w: Tensor, scale_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """Symmetric int8 per output channel: ``(q int8 [N, K], scale [N])`` with
    ``w ~ q x scale[:, None]``. Scales in ``scale_dtype`` (default ``w.dtype``); the integers are
    rounded against the stored scale."""
    _check_weight(w)
    wf = w.float()
    scale = (wf.abs().amax(dim=1) / 127).to(scale_dtype or w.dtype)
    q = torch.round(wf / _safe(scale.float())[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """``q x scale`` per row, computed in float32 and returned in ``dtype``."""
    return (q.float() * scale.float()[:, None]).to(dtype)


def pack_int4(u: Tensor) -> Tensor:
    """uint8 ``[N, K]`` of values 0..15 (K even) -> uint8 ``[N, K / 2]``: column ``2j`` in the
    high nibble of byte ``j``, column ``2j + 1`` in the low one."""
    if u.dim() != 2 or u.shape[1] % 2:
        raise ValueError(f"pack_int4 espera una matriz [N, K] con K par; se recibió forma "
                         f"{tuple(u.shape)}")
    if u.numel() and (int(u.min()) < 0 or int(u.max()) > 15):
        raise ValueError(f"pack_int4 espera enteros entre 0 y 15; se recibieron valores entre "
                         f"{int(u.min())} y {int(u.max())}")
    u = u.to(torch.uint8)
    return (u[:, 0::2] << 4) | u[:, 1::2]


def unpack_int4(packed: Tensor) -> Tensor:
    """The inverse of ``pack_int4``: uint8 ``[N, K / 2]`` -> uint8 ``[N, K]`` of values 0..15."""
    return torch.stack((packed >> 4, packed & 15), dim=-1).reshape(packed.shape[0], -1)


def quantize_int4(w: Tensor, group_size: int = 128, symmetric: bool = True,
                  scale_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """Group-wise int4: ``(packed uint8 [N, K / 2], scale [N, K / g], zero [N, K / g] or None)``.

    Symmetric: ``w ~ (u - 8) x scale``; asymmetric: ``w ~ zero + u x scale`` (``u`` in 0..15).
    """
    _check_weight(w)
    fmt = WeightFormat("int4" if symmetric else "int4-asym", group_size)
    N, K = w.shape
    fmt.check_shape(N, K, "el peso")
    dt = scale_dtype or w.dtype
    g = w.float().reshape(N, K // group_size, group_size)
    if symmetric:
        scale = (g.abs().amax(dim=-1) / 7).to(dt)
        q = torch.round(g / _safe(scale.float())[..., None]).clamp(-8, 7) + 8
        zero = None
    else:
        lo, hi = g.amin(dim=-1), g.amax(dim=-1)
        scale, zero = ((hi - lo) / 15).to(dt), lo.to(dt)
        q = torch.round((g - zero.float()[..., None]) / _safe(scale.float())[..., None]).clamp(0, 15)
    return pack_int4(q.reshape(N, K).to(torch.uint8)), scale, zero


def dequantize_int4(packed: Tensor, scale: Tensor, zero: Tensor | None, group_size: int,
                    dtype: torch.dtype = torch.float32) -> Tensor:
    """The matrix ``quantize_int4`` stored, computed in float32 and returned in ``dtype``."""
    N = packed.shape[0]
    u = torch.empty(N, packed.shape[1], 2, dtype=torch.float32, device=packed.device)
    u[..., 0] = packed >> 4   # unpacked straight into one float buffer, then scaled in place
    u[..., 1] = packed & 15
    g = u.view(N, -1, group_size)
    if zero is None:
        g.sub_(8).mul_(scale.float()[..., None])
    else:
        g.mul_(scale.float()[..., None]).add_(zero.float()[..., None])
    return u.view(N, -1).to(dtype)


@dataclass(frozen=True)
class QuantError:
    """``max_abs``: the largest |w - w_hat|; ``rel``: ||w - w_hat|| / ||w|| (Frobenius)."""

    max_abs: float
    rel: float


def quant_error(w: Tensor, w_hat: Tensor) -> QuantError:
    """How far the dequantized ``w_hat`` is from ``w`` (same shape), in float64."""
    if w.shape != w_hat.shape:
        raise ValueError(f"las formas no coinciden: {tuple(w.shape)} y {tuple(w_hat.shape)}")
    d = w.double() - w_hat.double()
    norm, err = float(w.double().norm()), float(d.norm())
    rel = err / norm if norm else (0.0 if err == 0 else math.inf)  # w = 0: exact or infinitely off
    return QuantError(float(d.abs().max()) if d.numel() else 0.0, rel)


# --- the layer -----------------------------------------------------------------------------------

def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} desconocido; aceptados: {', '.join(BACKENDS)}")


class QuantizedLinear(nn.Module):
    """A linear layer whose weight is stored in a ``WeightFormat`` (buffers ``qweight``,
    ``scales``, ``zeros`` for int4-asym, optional ``bias``, all saved in the state dict).

    ``forward`` takes ``[..., in_features]`` in any floating dtype and returns
    ``[..., out_features]`` in the same dtype. ``backend``: ``"reference"`` or ``"fast"``.
    """

    def __init__(self, in_features: int, out_features: int, fmt: str | WeightFormat,
                 bias: bool = False, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, backend: str = "fast") -> None:
        super().__init__()
        self.fmt = parse_weight_format(fmt)
        self.fmt.check_shape(out_features, in_features)
        self.in_features, self.out_features = in_features, out_features
        self.backend = backend
        if self.fmt.bits == 8:
            qshape, sshape, qdtype = (out_features, in_features), (out_features,), torch.int8
        else:
            qshape, qdtype = (out_features, in_features // 2), torch.uint8
            sshape = (out_features, in_features // self.fmt.group_size)
        self.register_buffer("qweight", torch.zeros(qshape, dtype=qdtype, device=device))
        self.register_buffer("scales", torch.zeros(sshape, dtype=dtype, device=device))
        self.register_buffer("zeros", None if self.fmt.symmetric
                             else torch.zeros(sshape, dtype=dtype, device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device)
                             if bias else None)
        self._fast: dict = {}  # kernel-specific copies (repacked weights, scales in x's dtype)

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str | WeightFormat, group_size: int | None = None,
                    backend: str = "fast") -> "QuantizedLinear":
        """Quantize ``linear``'s weight (scales in its dtype); the bias is copied as is."""
        fmt = parse_weight_format(fmt, group_size)
        w = linear.weight.detach()
        layer = cls(linear.in_features, linear.out_features, fmt, linear.bias is not None,
                    dtype=w.dtype, device=w.device, backend=backend)
        if fmt.bits == 8:
            layer.qweight, layer.scales = quantize_int8(w)
        else:
            layer.qweight, layer.scales, zero = quantize_int4(w, fmt.group_size, fmt.symmetric)
            if zero is not None:
                layer.zeros = zero
        if linear.bias is not None:
            layer.bias = linear.bias.detach().clone()
        return layer

    @property
    def backend(self) -> str:
        """``"reference"`` (dequantize, then matmul) or ``"fast"`` (a fused kernel if any)."""
        return self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        _check_backend(value)
        self._backend = value

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"fmt={self.fmt.name}, bias={self.bias is not None}, backend={self.backend}")

    def _apply(self, fn, recurse=True):  # .to() / .cuda(): the kernel copies are rebuilt on demand
        self._fast = {}
        return super()._apply(fn, recurse)

    # --- what it holds ---------------------------------------------------------------------------
    def weight_bytes(self) -> int:
        """Bytes of the stored layer: integers + scales (+ zeros) + bias. Without the bias this
        is ``fmt.linear_bytes(out_features, in_features, dtype)`` exactly."""
        return sum(t.nbytes for t in (self.qweight, self.scales, self.zeros, self.bias)
                   if t is not None)

    def held_bytes(self) -> int:
        """``weight_bytes()`` plus the copies the fast kernels built so far (int4: a repacked
        weight and scale/zero table; int8 with scales in another dtype: those scales)."""
        extra = sum(t.nbytes for v in self._fast.values() if v is not None
                    for t in (v if isinstance(v, tuple) else (v,)))
        return self.weight_bytes() + extra

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        """The ``[out_features, in_features]`` matrix the integers stand for, in ``dtype``
        (default: the scales' dtype)."""
        dtype = dtype or self.scales.dtype
        if self.fmt.bits == 8:
            return dequantize_int8(self.qweight, self.scales, dtype)
        return dequantize_int4(self.qweight, self.scales, self.zeros, self.fmt.group_size, dtype)

    # --- forward ----------------------------------------------------------------------------------
    def kernel(self, dtype: torch.dtype | None = None) -> str:
        """The path ``forward`` takes for inputs of ``dtype`` (default: the scales') on this
        layer's device: one of ``KERNELS``."""
        dtype = dtype or self.scales.dtype
        if self.backend == "reference":
            return "dequant-matmul"
        name = self._fast_kernel_name(dtype)
        if name is None or not _probe(name, self.qweight.device, dtype):
            return "dequant-matmul"
        return name

    def _fast_kernel_name(self, dtype: torch.dtype) -> str | None:
        """The fused kernel "fast" would use for ``dtype`` here, before probing."""
        dev = self.qweight.device.type
        if dev == "cpu" and dtype != torch.bfloat16:
            return None  # fp32/fp16 CPU variants are scalar loops: slower than the reference
        return self._kernel_for(dtype)

    def _kernel_for(self, dtype: torch.dtype) -> str | None:
        """The fused kernel this format, device and dtype could run, fast or not."""
        dev = self.qweight.device.type
        if dtype not in FAST_PATH_RTOL:
            return None
        if self.fmt.bits == 8:
            ok = dev in ("cpu", "cuda") and hasattr(torch, "_weight_int8pack_mm")
            return "int8pack-mm" if ok else None
        if self.fmt.group_size not in _INT4_KERNEL_GROUPS:
            return None
        if dev == "cpu" and hasattr(torch, "_weight_int4pack_mm_for_cpu"):
            return "int4pack-mm-cpu"
        if (dev == "cuda" and dtype == torch.bfloat16 and hasattr(torch, "_weight_int4pack_mm")
                and torch.cuda.get_device_capability(self.qweight.device) >= (8, 0)
                and self.in_features % 32 == 0):
            return "int4pack-mm-cuda"
        return None

    def forward_with(self, x: Tensor, kernel: str) -> Tensor:
        """``forward`` through a named path of ``KERNELS``, whatever the backend (to compare
        them). A fused kernel that this torch, device, format or dtype lacks raises ValueError."""
        if kernel not in KERNELS:
            raise ValueError(f"núcleo {kernel!r} desconocido; aceptados: {', '.join(KERNELS)}")
        if kernel != "dequant-matmul" and self._kernel_for(x.dtype) != kernel:
            raise ValueError(f"el núcleo {kernel} no está disponible para {self.fmt.name} con "
                             f"entradas {x.dtype} en {self.qweight.device.type} con torch "
                             f"{torch.__version__}; disponible: "
                             f"{self._kernel_for(x.dtype) or 'solo dequant-matmul'}")
        return self._forward(x, kernel)

    def forward(self, x: Tensor) -> Tensor:
        return self._forward(x, self.kernel(x.dtype))

    def _forward(self, x: Tensor, kernel: str) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"la entrada tiene {x.shape[-1]} columnas; esta capa espera "
                             f"in_features={self.in_features}")
        x2 = x.reshape(-1, self.in_features)
        y = _run(self, kernel if x2.shape[0] else "dequant-matmul", x2)
        return y.reshape(*x.shape[:-1], self.out_features)


def _run(layer: QuantizedLinear, name: str, x: Tensor) -> Tensor:
    """``x [M, K]`` through ``layer`` with kernel ``name``."""
    if name == "dequant-matmul":
        return F.linear(x, layer.dequantize(x.dtype), layer.bias)
    x = x.contiguous()
    N = layer.out_features
    key = (name, x.dtype)
    if name == "int8pack-mm":
        if layer.scales.dtype == x.dtype:
            scales = layer.scales
        else:
            if key not in layer._fast:
                layer._fast[key] = layer.scales.to(x.dtype)
            scales = layer._fast[key]
        y = torch._weight_int8pack_mm(x, layer.qweight, scales)
    else:
        if key not in layer._fast:
            layer._fast[key] = _int4_kernel_weights(layer, name, x.dtype)
        packed, scale_zero = layer._fast[key]
        g = layer.fmt.group_size
        if name == "int4pack-mm-cpu":
            y = torch._weight_int4pack_mm_for_cpu(x, packed, g, scale_zero)[:, :N]
        else:
            y = torch._weight_int4pack_mm(x, packed, g, scale_zero)[:, :N]
    return y if layer.bias is None else y + layer.bias.to(y.dtype)


def _int4_kernel_weights(layer: QuantizedLinear, name: str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The int4 kernels' own layout: a repacked weight (out_features padded to a multiple of 16)
    and ``[K / g, N_pad, 2]`` (scale, zero) with ``w = (u - 8) x scale + zero``."""
    N = layer.out_features
    pad = -N % _N_ALIGN
    qw = F.pad(layer.qweight, (0, 0, 0, pad), value=0x88)  # padded rows: u = 8, i.e. w = 0
    scale = layer.scales.float()
    # asymmetric: zero + u x scale = (u - 8) x scale + (zero + 8 x scale)
    zero = torch.zeros_like(scale) if layer.zeros is None else layer.zeros.float() + 8 * scale
    scale_zero = torch.stack((F.pad(scale, (0, 0, 0, pad)), F.pad(zero, (0, 0, 0, pad))), dim=-1)
    scale_zero = scale_zero.transpose(0, 1).contiguous().to(dtype)          # [K / g, N_pad, 2]
    if name == "int4pack-mm-cpu":
        packed = torch._convert_weight_to_int4pack_for_cpu(unpack_int4(qw).to(torch.int32), 1)
    else:
        K = layer.in_features
        tiles = next(t for t in (8, 4, 2) if K % (16 * t) == 0)
        packed = torch._convert_weight_to_int4pack(qw.contiguous(), tiles)
    return packed, scale_zero


_PROBED: dict[tuple[str, str, torch.dtype], bool] = {}


def _probe(name: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether kernel ``name`` runs here and agrees with the reference on a seeded layer
    (checked once per kernel, device type and dtype)."""
    key = (name, device.type, dtype)
    if key not in _PROBED:
        gen = torch.Generator().manual_seed(0)
        lin = nn.Linear(128, 40, bias=True)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(40, 128, generator=gen))
            lin.bias.copy_(torch.randn(40, generator=gen))
        fmt = "int8" if name == "int8pack-mm" else "int4-asym-g32"
        layer = QuantizedLinear.from_linear(lin.to(device=device, dtype=dtype), fmt)
        x = torch.randn(3, 128, generator=gen).to(device=device, dtype=dtype)
        try:
            with torch.no_grad():
                fast = _run(layer, name, x).float()
                ref = _run(layer, "dequant-matmul", x).float()
            ok = bool((fast - ref).abs().max() <= FAST_PATH_RTOL[dtype] * ref.abs().max())
        except (RuntimeError, NotImplementedError, TypeError, ValueError):
            ok = False
        _PROBED[key] = ok
    return _PROBED[key]


# --- the model ----------------------------------------------------------------------------------

def quantize_model(model: nn.Module, fmt: str | WeightFormat, group_size: int | None = None, *,
                   backend: str = "fast", inplace: bool = False) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (attention, MLP and the lm_head, also when it is
    tied to the embedding table, which stays in floating point for the lookup) by a
    ``QuantizedLinear`` in ``fmt`` (``"int8"``, ``"int4"``, ``"int4-asym"``, or with the group in
    the name, ``"int4-g64"``; int4 defaults to groups of 128).

    Returns a quantized copy and leaves ``model`` untouched; ``inplace=True`` quantizes ``model``
    itself and returns it. Every layer is checked before anything changes, so a bad format, group
    size or weight raises (in Spanish) and leaves ``model`` as it was. The result serves
    ``engine.LLMEngine`` / ``ModelRunner`` and ``generation.generate`` unchanged.
    """
    fmt = parse_weight_format(fmt, group_size)
    _check_backend(backend)
    done = [n for n, m in model.named_modules() if isinstance(m, QuantizedLinear)]
    if done:
        raise ValueError(f"el modelo ya está cuantizado ({len(done)} capas QuantizedLinear, por "
                         f"ejemplo {done[0]} en {quantized_format(model)}); cuantice el modelo "
                         f"original en coma flotante")
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("el modelo no tiene capas nn.Linear que cuantizar")
    for name, m in linears:
        fmt.check_shape(m.out_features, m.in_features, f"la capa {name}")
        _check_weight(m.weight.detach(), f"el peso de {name}")
    target = model if inplace else copy.deepcopy(model)
    by_name = dict(target.named_modules())
    new = {name: QuantizedLinear.from_linear(by_name[name], fmt, backend=backend)
           for name, _ in linears}
    for name, layer in new.items():
        parent, _, attr = name.rpartition(".")
        setattr(by_name[parent] if parent else target, attr, layer)
    return target


def quantized_layers(model: nn.Module) -> dict[str, QuantizedLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantizedLinear)}


def quantized_format(model: nn.Module) -> str | None:
    """The format name of the model's quantized layers (None if it has none)."""
    names = {m.fmt.name for m in quantized_layers(model).values()}
    return None if not names else names.pop() if len(names) == 1 else "+".join(sorted(names))


def set_backend(model: nn.Module, backend: str) -> nn.Module:
    """Switch every ``QuantizedLinear`` of ``model`` to ``"reference"`` or ``"fast"``."""
    _check_backend(backend)
    layers = quantized_layers(model)
    if not layers:
        raise ValueError("el modelo no tiene capas cuantizadas: use quantize_model primero")
    for m in layers.values():
        m.backend = backend
    return model


def kernels(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, int]:
    """How many quantized layers take each path (``QuantizedLinear.kernel``)."""
    out: dict[str, int] = {}
    for m in quantized_layers(model).values():
        k = m.kernel(dtype)
        out[k] = out.get(k, 0) + 1
    return out


def model_bytes(model: nn.Module) -> int:
    """Exact bytes of the model's parameters and persistent buffers, a tied tensor counted once
    (without the fast kernels' copies: see ``QuantizedLinear.held_bytes``)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + [b for _, b in model.named_buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.nbytes
    return total


def weight_errors(original: nn.Module, quantized: nn.Module) -> dict[str, QuantError]:
    """Per quantized layer, the error of its dequantized weight against the original's."""
    orig = dict(original.named_modules())
    out = {}
    for name, layer in quantized_layers(quantized).items():
        if not isinstance(orig.get(name), nn.Linear):
            raise ValueError(f"el modelo original no tiene una capa nn.Linear {name}")
        w = orig[name].weight.detach()
        out[name] = quant_error(w, layer.dequantize(torch.float32))
    return out


__all__ = ["BACKENDS", "FAST_PATH_RTOL", "KERNELS", "QuantError", "QuantizedLinear",
           "dequantize_int4", "dequantize_int8", "kernels", "model_bytes", "pack_int4",
           "quant_error", "quantize_int4", "quantize_int8", "quantize_model", "quantized_format",
           "quantized_layers", "set_backend", "unpack_int4", "weight_errors"]
