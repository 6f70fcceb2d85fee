"""ScatterNet classifiers (Tramèr & Boneh, "Differentially private learning needs better features (or much more
data)", ICLR 2021): a fixed scattering transform, a data-independent normalisation, and a small trainable head.

    image [C, H, W] -> scattering, J = 2, L = 8 (kymatio's; no parameters) -> [81 C, H/4, W/4]
                    -> GroupNorm without affine parameters (per example: needs no statistics of the data)
                    -> optionally (`fine=True`) beside it a J = 1 scattering, [9 C, H/2, W/2], flattened together
                    -> optionally (`prior=...`) a fixed projection onto `prior_dims` directions whitened on images
                       of a random process, fitted from a public seed without any data (models/random_prior.py)
                    -> head: one linear layer

Only the head has parameters, so DP-SGD (methods/dpsgd.py) trains it on features computed once: the transform is a
fixed function of each image (no privacy cost; a saved model is only its head, the transform rebuilt from (J, L,
size)). Reading chosen: GroupNorm, which the paper also reports, instead of per-channel statistics estimated under
DP, so no budget is spent on normalisation.

`make_scattering` (FastScattering2D, batched FFTs) equals kymatio within float32 rounding (tests/test_scatternet.py);
`import kymatio.torch` fails with SciPy >= 1.15 (its 3-D transform), so the 2-D modules are imported directly.
"""

from __future__ import annotations

import itertools
import math
import threading

import numba
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from privdistill.errors import ModelError
from privdistill.models.random_prior import PRIOR_TEXTURE, dead_leaves, unit_rows, whitening_projection
from privdistill.models.registry import register_model

SCATTER_ORDERS = 81  # 1 + J L + L^2 J (J - 1) / 2 coefficients per input channel at J = 2, L = 8
FINE_ORDERS = 9  # the same at J = 1: 1 + L
#: scatter-prior-linear's projection: its whitened dimensions and the dead-leaves images it is fitted on (both chosen
#: by measurement: docs/research-log.md, "Notes that left the code")
PRIOR_DIMS, PRIOR_IMAGES = 800, 100_000
#: the random processes a prior projection is fitted on -> their texture amplitude (models/random_prior.py)
PRIORS = {"none": 0.0, "dead-leaves": 0.0, "dead-leaves-textured": PRIOR_TEXTURE}
#: the registered ScatterNets with a linear head: the ones whose features take augmented copies (methods/dpsgd.py)
LINEAR_SCATTERNETS = ("scatter-linear", "scatter-prior-linear", "scatter-multiscale-prior-linear")


def make_scattering(image_size: tuple[int, int], *, J: int = 2, L: int = 8, reference: bool = False) -> nn.Module:
    """The 2-D scattering transform of [..., H, W] images -> [..., 1 + J L + L^2 J (J - 1) / 2, H / 2^J, W / 2^J]
    (kymatio's layout). `reference=True`: kymatio's own implementation (the tests' reference)."""
    try:
        from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D
    except ImportError as err:
        raise ModelError("ScatterNet models need kymatio: pip install 'privdistill[dpsgd]' (or pip install kymatio)"
                         ) from err
    if reference:
        return ScatteringTorch2D(J=J, shape=tuple(image_size), L=L)
    return FastScattering2D(J, tuple(image_size), L=L)


# ---- the fast transform ---------------------------------------------------------------------------------------------

def _lowpass_operators(phi_hat: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """kymatio's low-pass step at one resolution, u [m, n] real -> unpad(Re(ifft2(periodise_k(fft2(u) * phi_hat)))),
    as P u Q^T with real P [m/k - 2, m] and Q [n/k - 2, n]: phi_hat [m, n] (float64) is a Gaussian, separable (rank
    one up to float32 rounding) and even, so each factor is a real circular convolution, subsampled by k."""
    u, s, vt = torch.linalg.svd(phi_hat)
    if s[1] > 1e-6 * s[0]:
        raise ModelError("kymatio's low-pass filter is not separable: the fast scattering does not apply")
    factors = []
    for vec in (u[:, 0] * s[0].sqrt(), vt[0] * s[0].sqrt()):
        size = len(vec)
        f = torch.arange(size, dtype=torch.float64)
        dft = torch.exp(-2j * math.pi * torch.outer(f, f) / size)  # [frequency, x]
        # periodising the spectrum by k then an inverse FFT of size/k = the inverse FFT's every k-th sample
        idft = torch.exp(2j * math.pi * torch.outer(f[::k], f) / size) / size  # [x', frequency]
        op = (idft * vec) @ dft
        if op.imag.abs().max() > 1e-6 * op.real.abs().max():
            raise ModelError("kymatio's low-pass filter is not even: the fast scattering does not apply")
        factors.append(op.real[1:-1])  # kymatio's unpad drops one sample at each end
    return factors[0], factors[1]


def _lowpass(u: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """[..., m, n] -> P u Q^T, [..., h, w], as two products with many rows each."""
    return ((u @ q.T).transpose(-1, -2) @ p.T).transpose(-1, -2)


def _periodised_product(x_hat: torch.Tensor, filters: torch.Tensor, k: int) -> torch.Tensor:
    """x_hat [..., M, N] complex spectra, filters [F, M, N] real -> [..., F, M/k, N/k]: each spectrum times each
    filter, its k x k aliasing blocks summed (kymatio's cdgmm then subsample_fourier, the mean's 1/k^2 is in the
    filters)."""
    m, n = filters.shape[-2] // k, filters.shape[-1] // k
    x_hat = x_hat.unsqueeze(-3)
    out = None
    for a in range(k):
        for c in range(k):
            term = x_hat[..., a * m:(a + 1) * m, c * n:(c + 1) * n] * filters[:, a * m:(a + 1) * m, c * n:(c + 1) * n]
            out = term if out is None else out + term
    return out


#: the compiled kernel may reassociate and contract (fused multiply-add) its float32 sums: rounding differences only
_FASTMATH = {"contract", "reassoc", "nsz", "arcp"}


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _idft_lanes(z_r, z_i, out_r, out_i, base, twiddles):  # pragma: no cover - compiled
    """The inverse DFT along axis 0 of z [n, L] (real and imaginary parts) -> out [n, L], for n = 2^a b: dense
    inverse DFTs of size b (base [2, b, b], 1 / n included) of the 2^a decimated sequences, then a levels of radix-2
    butterflies (twiddles [2, a, n / 2]). Every step runs along the L lanes, contiguous (vectorised)."""
    n, lanes = z_r.shape
    b, levels = base.shape[1], twiddles.shape[1]
    stride = n // b
    for r in range(stride):
        position, rest = 0, r
        for _ in range(levels):  # decimation in time: the bit-reversed order
            position = (position << 1) | (rest & 1)
            rest >>= 1
        for k in range(b):
            o_r, o_i = out_r[position * b + k], out_i[position * b + k]
            o_r[:] = 0
            o_i[:] = 0
            for t in range(b):
                g_r, g_i = base[0, t, k], base[1, t, k]
                a_r, a_i = z_r[t * stride + r], z_i[t * stride + r]
                for lane in range(lanes):
                    o_r[lane] += a_r[lane] * g_r - a_i[lane] * g_i
                    o_i[lane] += a_r[lane] * g_i + a_i[lane] * g_r
    size = b
    for level in range(levels):
        half, size = size, 2 * size
        for start in range(0, n, size):
            for k in range(half):
                w_r, w_i = twiddles[0, level, k], twiddles[1, level, k]
                e_r, e_i = out_r[start + k], out_i[start + k]
                o_r, o_i = out_r[start + half + k], out_i[start + half + k]
                for lane in range(lanes):
                    t_r = o_r[lane] * w_r - o_i[lane] * w_i
                    t_i = o_r[lane] * w_i + o_i[lane] * w_r
                    o_r[lane] = e_r[lane] - t_r
                    o_i[lane] = e_i[lane] - t_i
                    e_r[lane] += t_r
                    e_i[lane] += t_i


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _wavelet_kernel(start, stop, half, filters, base_rows, twiddles_rows, base_cols, twiddles_cols, p, q, lanes, s,
                    u):  # pragma: no cover - compiled
    """One scale of wavelets on real maps, fused: for each map and filter, |ifft2(periodise_k(spectrum * filter))|,
    then the low-pass P . Q^T, within the cache; blocks [start, stop) of `lanes` maps.

    half [R, M, 2 (N // 2 + 1)]: the maps' half spectra (rfft2, float32 pairs); filters [F, M, N] (real, the
    periodisation's 1 / k^2 included); the inverse DFTs of the output grid, m = M / k by n = N / k, as _idft_lanes
    reads them (base_rows, twiddles_rows for the m rows, base_cols, twiddles_cols for the n columns); p [h, m],
    q [w, n] -> s [R, F, h, w], and the moduli u [R, F, m, n] unless u has no rows. The maps of a block are the
    innermost (vectorised) axis of every step."""
    maps, kept = half.shape[0], half.shape[2] // 2
    count, M, N = filters.shape
    m, n = base_rows.shape[1] << twiddles_rows.shape[1], base_cols.shape[1] << twiddles_cols.shape[1]
    h, w = p.shape[0], q.shape[0]
    ka, kc = M // m, N // n
    keep = u.shape[0] > 0
    for block in range(start, stop):
        r0 = block * lanes
        v = min(lanes, maps - r0)
        # the block's full spectra, maps innermost (the columns past the half: conjugates of the mirrored ones)
        fr = np.zeros((M, N, lanes), np.float32)
        fi = np.zeros((M, N, lanes), np.float32)
        for k1 in range(M):
            mirrored = (M - k1) % M
            for k2 in range(N):
                o_r, o_i = fr[k1, k2], fi[k1, k2]
                if k2 < kept:
                    for lane in range(v):
                        o_r[lane] = half[r0 + lane, k1, 2 * k2]
                        o_i[lane] = half[r0 + lane, k1, 2 * k2 + 1]
                else:
                    for lane in range(v):
                        o_r[lane] = half[r0 + lane, mirrored, 2 * (N - k2)]
                        o_i[lane] = -half[r0 + lane, mirrored, 2 * (N - k2) + 1]
        zr, zi = np.empty((n, lanes), np.float32), np.empty((n, lanes), np.float32)
        yr, yi = np.empty((m, n, lanes), np.float32), np.empty((m, n, lanes), np.float32)
        wr, wi = np.empty((m, n * lanes), np.float32), np.empty((m, n * lanes), np.float32)
        modulus = np.empty((m, n, lanes), np.float32)
        row, acc = np.empty((n, lanes), np.float32), np.empty(lanes, np.float32)
        for f in range(count):
            for x in range(m):  # row x of the periodised product, and its inverse DFT along the columns
                zr[:] = 0
                zi[:] = 0
                for a in range(ka):
                    for c in range(kc):
                        for t in range(n):
                            weight = filters[f, a * m + x, c * n + t]
                            a_r, a_i, o_r, o_i = fr[a * m + x, c * n + t], fi[a * m + x, c * n + t], zr[t], zi[t]
                            for lane in range(lanes):
                                o_r[lane] += a_r[lane] * weight
                                o_i[lane] += a_i[lane] * weight
                _idft_lanes(zr, zi, yr[x], yi[x], base_cols, twiddles_cols)
            # the inverse DFT along the rows (every column and map a lane), then the modulus
            _idft_lanes(yr.reshape(m, n * lanes), yi.reshape(m, n * lanes), wr, wi, base_rows, twiddles_rows)
            for x in range(m):
                o, a_r, a_i = modulus[x].reshape(n * lanes), wr[x], wi[x]
                for lane in range(n * lanes):
                    o[lane] = np.sqrt(a_r[lane] * a_r[lane] + a_i[lane] * a_i[lane])
            if keep:
                for x in range(m):
                    for y in range(n):
                        a_r = modulus[x, y]
                        for lane in range(v):
                            u[r0 + lane, f, x, y] = a_r[lane]
            for i in range(h):  # the low-pass
                row[:] = 0
                for x in range(m):
                    weight = p[i, x]
                    for y in range(n):
                        o, a_r = row[y], modulus[x, y]
                        for lane in range(lanes):
                            o[lane] += weight * a_r[lane]
                for j in range(w):
                    acc[:] = 0
                    for y in range(n):
                        weight, a_r = q[j, y], row[y]
                        for lane in range(lanes):
                            acc[lane] += a_r[lane] * weight
                    for lane in range(v):
                        s[r0 + lane, f, i, j] = acc[lane]


def _idft_plan(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse DFT of `size` = 2^a b (b odd; 1 / size included) as _idft_lanes reads it: the dense inverse
    DFT of size b [2, b, b] (real and imaginary parts) and the twiddle factors of the a radix-2 levels
    [2, a, size / 2] (level l's first 2^l b / 2 used), float32."""
    levels = (size & -size).bit_length() - 1
    b = size >> levels
    t = torch.arange(b, dtype=torch.float64)
    base = torch.exp(2j * math.pi * torch.outer(t, t) / b) / size
    twiddles = torch.zeros(levels, max(size // 2, 1), dtype=torch.complex128)
    for level in range(levels):
        span = 2 ** (level + 1) * b
        twiddles[level, :span // 2] = torch.exp(2j * math.pi * torch.arange(span // 2, dtype=torch.float64) / span)
    return (torch.stack([base.real, base.imag]).float().contiguous(),
            torch.stack([twiddles.real, twiddles.imag]).float().contiguous())


def _in_threads(kernel, count: int, *args) -> None:
    """kernel(start, stop, *args) over [0, count) on torch's intra-op thread count (the kernel releases the GIL),
    the ranges handed out as the threads ask for them: a core busy with another process slows its thread, not the
    call. Plain threads, started per call: nothing to go stale across a fork."""
    threads = max(1, min(torch.get_num_threads(), count))
    if threads == 1:
        kernel(0, count, *args)
        return
    step = max(1, count // (4 * threads))
    starts = itertools.count(0, step)  # next() on it is atomic under the GIL
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for start in starts:
                if start >= count or errors:
                    return
                kernel(start, min(start + step, count), *args)
        except BaseException as err:  # re-raised by the calling thread: no silently unfilled outputs
            errors.append(err)

    workers = [threading.Thread(target=work) for _ in range(threads - 1)]
    for worker in workers:
        worker.start()
    work()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]


def _half_spectrum(maps: torch.Tensor) -> torch.Tensor:
    """[R, M, N] real -> their rfft2, [R, M, 2 (N // 2 + 1)] as float32 pairs."""
    return torch.view_as_real(torch.fft.rfft2(maps)).flatten(-2).contiguous()


class FastScattering2D(nn.Module):
    """kymatio's Scattering2D(J, shape, L) (max order 2, pre_pad False, out_type "array"): [..., H, W] images ->
    [..., K, H / 2^J, W / 2^J], K = 1 + J L + L^2 J (J - 1) / 2, in kymatio's order (the zeroth order, the first by
    (j1, theta1), the second by (j1, theta1, j2, theta2)). `chunk` images (and channels) are transformed at a
    time. Its buffers are rebuilt from (J, shape, L), never saved."""

    def __init__(self, J: int, shape: tuple[int, int], L: int = 8, chunk: int = 256):
        super().__init__()
        from kymatio.scattering2d.backend.torch_backend import Pad
        from kymatio.scattering2d.filter_bank import filter_bank
        from kymatio.scattering2d.utils import compute_padding

        M, N = shape
        if J < 1 or 2 ** J > M or 2 ** J > N:
            raise ModelError(f"a scattering at J = {J} needs J >= 1 and images of at least 2^J pixels a side, "
                             f"got {M}x{N}")
        self.J, self.L, self.shape, self.chunk = J, L, (M, N), chunk
        Mp, Np = compute_padding(M, N, J)  # multiples of 2^J: the grids of the scales j < J are even
        # kymatio's reflection padding, read off its own Pad applied to the pixel indices: a row and a column index
        pad = Pad([(Mp - M) // 2, (Mp - M + 1) // 2, (Np - N) // 2, (Np - N + 1) // 2], [M, N])
        index = pad(torch.arange(M * N, dtype=torch.float64).reshape(M, N))[..., 0].long()
        rows, cols = index[:, 0] // N, index[0] % N
        if not torch.equal(index, rows[:, None] * N + cols[None]):
            raise ModelError("kymatio's padding is not separable: the fast scattering does not apply")
        self.register_buffer("pad_rows", rows, persistent=False)
        self.register_buffer("pad_cols", cols, persistent=False)
        bank = filter_bank(Mp, Np, J, L)
        as_tensor = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64))  # noqa: E731
        # the low-pass at each resolution 2^-j, subsampled to 2^-J and unpadded: phi_p{j} . phi_q{j}^T
        for j, level in enumerate(bank["phi"]["levels"]):
            p, q = _lowpass_operators(as_tensor(level), 2 ** (J - j))
            self.register_buffer(f"phi_p{j}", p.float().contiguous(), persistent=False)
            self.register_buffer(f"phi_q{j}", q.float().contiguous(), persistent=False)
            if j == 0:  # the zeroth order reads the image itself: the padding folded into the operators
                self.register_buffer("phi_p_image", p.new_zeros(len(p), M).index_add_(1, rows, p).float(),
                                     persistent=False)
                self.register_buffer("phi_q_image", q.new_zeros(len(q), N).index_add_(1, cols, q).float(),
                                     persistent=False)
            # the inverse DFTs of the grid at resolution 2^-j (the compiled kernel's)
            for axis, size in (("rows", Mp // 2 ** j), ("cols", Np // 2 ** j)):
                base, twiddles = _idft_plan(size)
                self.register_buffer(f"idft_{axis}{j}", base, persistent=False)
                self.register_buffer(f"twiddles_{axis}{j}", twiddles, persistent=False)
        # the wavelets of scale j2 at the resolution 2^-j1 they are applied at (the first order's at j1 = 0), the
        # periodisation's mean (1 / k^2, k = 2^(j2 - j1)) folded in
        for j1 in range(J):
            psi = torch.stack([as_tensor(f["levels"][0]) for f in bank["psi"] if f["j"] == j1]) / 4 ** j1
            self.register_buffer(f"psi{j1}", psi.float(), persistent=False)
            for j2 in range(j1 + 1, J):
                psi = torch.stack([as_tensor(f["levels"][j1]) for f in bank["psi"] if f["j"] == j2]) / 4 ** (j2 - j1)
                self.register_buffer(f"psi{j1}_{j2}", psi.float(), persistent=False)

    def extra_repr(self) -> str:
        return f"J={self.J}, shape={self.shape}, L={self.L}"

    @property
    def out_shape(self) -> tuple[int, int, int]:
        """(K, h, w): the coefficients per input channel and their grid."""
        J, L = self.J, self.L
        return 1 + J * L + L * L * J * (J - 1) // 2, len(self.phi_p0), len(self.phi_q0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != self.shape:
            raise ModelError(f"this scattering reads images of {self.shape[0]}x{self.shape[1]}, got "
                             f"{tuple(x.shape[-2:])}")
        batch = x.shape[:-2]
        x = x.reshape(-1, *self.shape).to(self.psi0.dtype)
        compiled = (x.device.type == "cpu" and x.dtype == torch.float32
                    and not (torch.is_grad_enabled() and x.requires_grad))
        # the low-pass is a matrix product: kept in float32 under autocast (kymatio's FFTs and products are too)
        with torch.autocast(x.device.type, enabled=False):
            parts = [self._scatter(x[i:i + self.chunk], compiled) for i in range(0, len(x), self.chunk)]
        s = torch.cat(parts) if parts else x.new_zeros(0, *self.out_shape)
        return s.reshape(*batch, *s.shape[1:])

    def _scatter(self, x: torch.Tensor, compiled: bool) -> torch.Tensor:
        """[B, M, N] -> [B, K, h, w]: kymatio's core.scattering2d, all the wavelets of a scale at once. `compiled`:
        from half spectra (torch's rfft2), every scale of wavelets one call of the compiled kernel (on the CPU, in
        float32, without gradients); else torch operations (differentiable, any device)."""
        J, L, (_, h, w) = self.J, self.L, self.out_shape
        spectrum, wavelets = (_half_spectrum, self._wavelets) if compiled else (torch.fft.fft2, self._wavelets_torch)
        out, second = [_lowpass(x, self.phi_p_image, self.phi_q_image)[:, None]], []
        x_hat = spectrum(x[:, self.pad_rows][:, :, self.pad_cols])
        for j1 in range(J):
            s1, u1 = wavelets(x_hat, f"psi{j1}", j1, keep=j1 + 1 < J)
            out.append(s1.view(len(x), L, h, w))
            if j1 + 1 < J:
                u1_hat = spectrum(u1.flatten(0, 1))
                second.append(torch.cat([wavelets(u1_hat, f"psi{j1}_{j2}", j2)[0].view(len(x), L, L, h, w)
                                         for j2 in range(j1 + 1, J)], 2).flatten(1, 2))
        return torch.cat(out + second, 1)

    def _wavelets_torch(self, spectrum: torch.Tensor, filters: str, j: int, keep: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """_wavelets as torch operations, on full spectra [R, M', N'] (the moduli are always returned)."""
        filters = getattr(self, filters)
        k = filters.shape[-1] // getattr(self, f"phi_q{j}").shape[1]  # the periodisation: M' / m
        u = torch.fft.ifft2(_periodised_product(spectrum, filters, k)).abs()
        return _lowpass(u, getattr(self, f"phi_p{j}"), getattr(self, f"phi_q{j}")), u

    def _wavelets(self, half: torch.Tensor, filters: str, j: int, keep: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """_wavelet_kernel on half spectra [R, ...] with the named filters, on the grid at resolution 2^-j ->
        the low-passed moduli [R, F, h, w] and, with `keep`, the moduli [R, F, m, n]."""
        filters = getattr(self, filters)
        (_, h, w), m, n = self.out_shape, getattr(self, f"phi_p{j}").shape[1], getattr(self, f"phi_q{j}").shape[1]
        # maps per block: its working set (the spectra on the M x N grid, five m x n arrays) within a core's L2
        lanes = 64
        while lanes > 8 and 4 * lanes * (2 * filters.shape[1] * filters.shape[2] + 5 * m * n) > 3 << 19:
            lanes //= 2
        s = torch.empty(len(half), len(filters), h, w)
        u = torch.empty(len(half) if keep else 0, len(filters), m, n)
        _in_threads(_wavelet_kernel, -(-len(half) // lanes), half.numpy(), filters.numpy(),
                    getattr(self, f"idft_rows{j}").numpy(), getattr(self, f"twiddles_rows{j}").numpy(),
                    getattr(self, f"idft_cols{j}").numpy(), getattr(self, f"twiddles_cols{j}").numpy(),
                    getattr(self, f"phi_p{j}").numpy(), getattr(self, f"phi_q{j}").numpy(), lanes, s.numpy(), u.numpy())
        return s, u


class ScatterNet(nn.Module):
    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int | tuple[int, int] = 28,
                 groups: int = 27, prior: str = "none", prior_dims: int = PRIOR_DIMS, prior_images: int = PRIOR_IMAGES,
                 fine: bool = False):
        super().__init__()
        h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
        # J = 2 subsamples by 4: other sides are padded up to a multiple of 4 by repeating the edge pixels (a fixed,
        # data-independent map, so nothing about the privacy of what is trained on the features changes)
        in_h, in_w, h, w = h, w, -(-h // 4) * 4, -(-w // 4) * 4
        top, left = (h - in_h) // 2, (w - in_w) // 2
        self._pad = (left, w - in_w - left, top, h - in_h - top)
        channels = SCATTER_ORDERS * in_channels
        if channels % groups:
            raise ModelError(f"GroupNorm groups ({groups}) must divide the {channels} scattering channels")
        # not a submodule: a fixed function, rebuilt rather than saved (see _apply for device moves)
        object.__setattr__(self, "_scattering", make_scattering((h, w)))
        self.norm = nn.GroupNorm(groups, channels, affine=False)
        self.fine = fine
        scattered = channels * (h // 4) * (w // 4)
        if fine:  # J = 1 beside J = 2: the first order at twice the spatial resolution, each channel normalised alone
            object.__setattr__(self, "_fine_scattering", make_scattering((h, w), J=1))
            fine_channels = FINE_ORDERS * in_channels
            self.fine_norm = nn.GroupNorm(fine_channels, fine_channels, affine=False)
            scattered += fine_channels * (h // 2) * (w // 2)
        self.feature_dim = scattered
        # flattens the last three dims: [B, K, C, h, w] features (K augmented copies, methods/dpsgd.py) give
        # [B, K, classes]; the state dict is the same as with nn.Flatten()
        self.head = nn.Sequential(nn.Flatten(start_dim=-3), nn.Linear(self.feature_dim, num_classes))
        if prior not in PRIORS:
            raise ModelError(f"ScatterNet prior must be one of {sorted(PRIORS)}, got {prior!r}")
        self.prior, self.prior_images, self.image_shape = prior, prior_images, (in_channels, in_h, in_w)
        self.in_channels = in_channels
        # what the fixed features depend on (the head does not): the key of their cached stage
        padded, scales = f"-padded{h}x{w}" if any(self._pad) else "", "-fineJ1" if fine else ""
        self.transform_id = f"scattering-J2-L8-{in_channels}x{in_h}x{in_w}{padded}-groupnorm{groups}{scales}"
        if prior != "none":
            # buffers, saved with the weights: a released model carries its projection. Zero until fit_prior()
            # (or loading saved weights) fills them; scatter() refuses to run before that.
            prior_dims = min(prior_dims, scattered, prior_images)  # (small images have fewer coefficients)
            self.register_buffer("prior_projection", torch.zeros(scattered, prior_dims))
            self.register_buffer("prior_fitted", torch.zeros((), dtype=torch.bool))
            self.feature_dim = prior_dims
            self.head = nn.Sequential(nn.Flatten(start_dim=-3), nn.Linear(prior_dims, num_classes))
            self.transform_id += f"-{prior}-{prior_images}-whitened{prior_dims}"

    def _apply(self, fn, recurse=True):  # .to(device) / .float() reach the (unregistered) scattering too
        self._scattering._apply(fn, recurse)
        if self.fine:
            self._fine_scattering._apply(fn, recurse)
        return super()._apply(fn, recurse)

    def normalised_scattering(self, x: torch.Tensor) -> torch.Tensor:
        """The scattering coefficients, normalised per example: [B, 81 C, H/4, W/4], or with the fine scale both
        scales flattened side by side, [B, D, 1, 1] (the head's Flatten(-3) reads either)."""
        x = x.float()
        if any(self._pad):  # [..., H, W] as one stack of planes: replicate-padding reads 4-D input
            padded = F.pad(x.reshape(-1, 1, *x.shape[-2:]), self._pad, mode="replicate")
            x = padded.reshape(*x.shape[:-2], *padded.shape[-2:])
        s = self.norm(self._scattering(x).flatten(1, 2))  # [B, 81 C, H/4, W/4]
        if not self.fine:
            return s
        f = self.fine_norm(self._fine_scattering(x).flatten(1, 2))  # [B, 9 C, H/2, W/2]
        return torch.cat([s.flatten(1), f.flatten(1)], 1)[:, :, None, None]

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """The fixed features the head reads: scattering coefficients, normalised per example (and, with a prior,
        projected onto its whitened directions: [B, prior_dims, 1, 1], so the head's Flatten(-3) reads both)."""
        return self.project(self.normalised_scattering(x))

    def project(self, s: torch.Tensor) -> torch.Tensor:
        """Normalised scattering coefficients -> the features the head reads (the prior's whitened projection, or
        the coefficients themselves without a prior)."""
        if self.prior == "none":
            return s
        if not bool(self.prior_fitted):
            raise ModelError("this ScatterNet's prior projection is not fitted: call fit_prior() or load its weights")
        return (unit_rows(s.flatten(1)) @ self.prior_projection)[:, :, None, None]

    def scattering_only(self) -> "ScatterNet":
        """A linear ScatterNet with this one's scattering and normalisation but no prior: its `scatter` is this
        model's `normalised_scattering` (whose cached features stage it names)."""
        return ScatterNet(self.in_channels, self.head[-1].out_features, self.image_shape[1:],
                          groups=self.norm.num_groups, fine=self.fine)

    def fit_prior(self, batch_size: int = 1000) -> None:
        """Fit the prior projection on `prior_images` dead-leaves images (a fixed public seed; no data is read).
        Minutes on a CPU; the `scatter_prior` stage caches it."""
        channels, h, w = self.image_shape
        images = dead_leaves(self.prior_images, channels=channels, size=(h, w), texture=PRIORS[self.prior])
        device = self.prior_projection.device
        with torch.no_grad():
            features = torch.cat([self.normalised_scattering(images[i:i + batch_size].to(device)).flatten(1).cpu()
                                  for i in range(0, len(images), batch_size)])
        self.prior_projection.copy_(whitening_projection(features, self.prior_projection.shape[1]))
        self.prior_fitted.fill_(True)

    # the classifier contract of every model here (models/cnn.py): forward = classifier(features)
    @property
    def classifier(self) -> nn.Module:
        return self.head[-1]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.head[:-1](self.scatter(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scatter(x))


@register_model("scatter-linear", kind="classifier",
                description="ScatterNet (kymatio, J=2, L=8) + GroupNorm + linear (Tramer & Boneh 2021), for DP-SGD")
def scatter_linear(in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> ScatterNet:
    return ScatterNet(in_channels, num_classes, image_size)


@register_model("scatter-prior-linear", kind="classifier",
                description="ScatterNet + GroupNorm + a projection whitened on dead-leaves images (no data) + linear")
def scatter_prior_linear(in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> ScatterNet:
    return ScatterNet(in_channels, num_classes, image_size, prior="dead-leaves", prior_dims=PRIOR_DIMS,
                      prior_images=PRIOR_IMAGES)


@register_model("scatter-multiscale-prior-linear", kind="classifier",
                description="ScatterNet at J=2 and J=1 + GroupNorm + the textured dead-leaves projection + linear")
def scatter_multiscale_prior_linear(in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> ScatterNet:
    return ScatterNet(in_channels, num_classes, image_size, prior="dead-leaves-textured",
                      prior_dims=PRIOR_DIMS, prior_images=PRIOR_IMAGES, fine=True)
