"""The Triton kernels behind :mod:`fadat.kernels.triton_dag` (see there for the maths, the
launch configuration and how they are selected and tested).

Imported only by :func:`fadat.kernels.triton_dag._kernels`, on first use: importing ``triton``
fixes compiler-or-interpreter (``TRITON_INTERPRET``) for the whole process.
"""

from __future__ import annotations

import triton
import triton.language as tl

# A kernel may read only constexpr globals.
NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def forward_kernel(
    match_ptr,  # (B, T, L) f32, contiguous
    links_ptr,  # (B, L, L) f32, contiguous
    alpha_ptr,  # (B, T, L) f32 out, pre-filled with −inf
    glen_ptr,  # (B,) int64
    tlen_ptr,  # (B,) int64
    steps,
    size,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    n_vert = tl.load(glen_ptr + b).to(tl.int32)
    n_step = tl.load(tlen_ptr + b).to(tl.int32)
    match_b = match_ptr + b * steps * size
    links_b = links_ptr + b * size * size
    alpha_b = alpha_ptr + b * steps * size
    start = tl.load(match_b)
    tl.store(alpha_b, start)
    tl.debug_barrier()
    for t in range(1, n_step):
        for j0 in range(0, size, BLOCK_J):
            j = j0 + tl.arange(0, BLOCK_J)  # (BJ,)
            run_max = tl.full([BLOCK_J], NEG_INF, tl.float32)
            run_sum = tl.zeros([BLOCK_J], tl.float32)
            # Only sources i < j: tiles up to the diagonal.
            for i0 in range(0, j0 + BLOCK_J, BLOCK_I):
                i = i0 + tl.arange(0, BLOCK_I)  # (BI,)
                prev = tl.load(alpha_b + (t - 1) * size + i, mask=i < size, other=NEG_INF)
                ok = (i[:, None] < j[None, :]) & (j[None, :] < n_vert)  # (BI, BJ)
                edge = tl.load(links_b + i[:, None] * size + j[None, :], mask=ok, other=NEG_INF)
                x = prev[:, None] + edge  # (BI, BJ)
                new_max = tl.maximum(run_max, tl.max(x, 0))
                # An all −inf column keeps shift 0 so that −inf − shift never is NaN.
                shift = tl.where(new_max == NEG_INF, 0.0, new_max)
                run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(tl.exp(x - shift[None, :]), 0)
                run_max = new_max
            emit = tl.load(match_b + t * size + j, mask=j < n_vert, other=NEG_INF)
            # log 0 = −inf where unreachable, without taking log(0)
            has = run_sum > 0
            lse = tl.where(has, run_max + tl.log(tl.where(has, run_sum, 1.0)), NEG_INF)
            value = lse + emit
            tl.store(alpha_b + t * size + j, value, mask=j < size)
        tl.debug_barrier()  # step t is read by every thread at step t + 1


@triton.jit
def backward_kernel(
    match_ptr,  # (B, T, L) f32
    links_ptr,  # (B, L, L) f32
    beta_ptr,  # (B, T, L) f32 out, pre-filled with −inf
    glen_ptr,
    tlen_ptr,
    steps,
    size,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    n_vert = tl.load(glen_ptr + b).to(tl.int32)
    n_step = tl.load(tlen_ptr + b).to(tl.int32)
    match_b = match_ptr + b * steps * size
    links_b = links_ptr + b * size * size
    beta_b = beta_ptr + b * steps * size
    tl.store(beta_b + (n_step - 1) * size + (n_vert - 1), 0.0)
    tl.debug_barrier()
    for s in range(0, n_step - 1):
        t = n_step - 1 - s  # g_{t−1} from g_t
        for i0 in range(0, size, BLOCK_I):
            i = i0 + tl.arange(0, BLOCK_I)  # (BI,)
            run_max = tl.full([BLOCK_I], NEG_INF, tl.float32)
            run_sum = tl.zeros([BLOCK_I], tl.float32)
            # Only destinations j > i: tiles from the diagonal on.
            for j0 in range((i0 // BLOCK_J) * BLOCK_J, size, BLOCK_J):
                j = j0 + tl.arange(0, BLOCK_J)  # (BJ,)
                on = j < n_vert
                h = tl.load(match_b + t * size + j, mask=on, other=NEG_INF) + tl.load(
                    beta_b + t * size + j, mask=on, other=NEG_INF
                )  # (BJ,)
                ok = (i[:, None] < j[None, :]) & on[None, :]  # (BI, BJ)
                edge = tl.load(links_b + i[:, None] * size + j[None, :], mask=ok, other=NEG_INF)
                x = edge + h[None, :]  # (BI, BJ)
                new_max = tl.maximum(run_max, tl.max(x, 1))
                shift = tl.where(new_max == NEG_INF, 0.0, new_max)
                run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(tl.exp(x - shift[:, None]), 1)
                run_max = new_max
            has = run_sum > 0
            value = tl.where(has, run_max + tl.log(tl.where(has, run_sum, 1.0)), NEG_INF)
            tl.store(beta_b + (t - 1) * size + i, value, mask=i < size)
        tl.debug_barrier()


@triton.jit
def links_grad_kernel(
    match_ptr,  # (B, T, L) f32
    links_ptr,  # (B, L, L) f32
    alpha_ptr,  # (B, T, L) f32
    beta_ptr,  # (B, T, L) f32
    shift_ptr,  # (B,) f32: log P, 0 where not finite
    scale_ptr,  # (B,) f32: upstream gradient, 0 where log P is not finite
    grad_ptr,  # (B, L, L) f32 out
    glen_ptr,
    tlen_ptr,
    steps,
    size,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)  # (BI,)
    j = tl.program_id(2) * BLOCK_J + tl.arange(0, BLOCK_J)  # (BJ,)
    n_vert = tl.load(glen_ptr + b).to(tl.int32)
    n_step = tl.load(tlen_ptr + b).to(tl.int32)
    log_z = tl.load(shift_ptr + b)
    scale = tl.load(scale_ptr + b)
    match_b = match_ptr + b * steps * size
    alpha_b = alpha_ptr + b * steps * size
    beta_b = beta_ptr + b * steps * size
    on = j < n_vert
    ok = (i[:, None] < j[None, :]) & on[None, :]  # (BI, BJ)
    offs = b * size * size + i[:, None] * size + j[None, :]  # (BI, BJ)
    edge = tl.load(links_ptr + offs, mask=ok, other=NEG_INF) - log_z
    acc = tl.zeros([BLOCK_I, BLOCK_J], tl.float32)
    for t in range(1, n_step):
        prev = tl.load(alpha_b + (t - 1) * size + i, mask=i < size, other=NEG_INF)
        h = tl.load(match_b + t * size + j, mask=on, other=NEG_INF) + tl.load(
            beta_b + t * size + j, mask=on, other=NEG_INF
        )
        acc += tl.exp(prev[:, None] + edge + h[None, :])  # edge posterior at step t
    inside = (i[:, None] < size) & (j[None, :] < size)
    tl.store(grad_ptr + offs, acc * scale, mask=inside)


@triton.jit
def viterbi_kernel(
    match_ptr,  # (B, T, L) f32
    links_ptr,  # (B, L, L) f32
    alpha_ptr,  # (B, T, L) f32 scratch, pre-filled with −inf
    back_ptr,  # (B, T, L) int32 scratch
    path_ptr,  # (B, L) int64 out, pre-filled with −1
    glen_ptr,
    tlen_ptr,
    steps,
    size,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    n_vert = tl.load(glen_ptr + b).to(tl.int32)
    n_step = tl.load(tlen_ptr + b).to(tl.int32)
    match_b = match_ptr + b * steps * size
    links_b = links_ptr + b * size * size
    alpha_b = alpha_ptr + b * steps * size
    back_b = back_ptr + b * steps * size
    tl.store(alpha_b, tl.load(match_b))
    tl.debug_barrier()
    for t in range(1, n_step):
        for j0 in range(0, size, BLOCK_J):
            j = j0 + tl.arange(0, BLOCK_J)
            best = tl.full([BLOCK_J], NEG_INF, tl.float32)
            arg = tl.zeros([BLOCK_J], tl.int32)
            for i0 in range(0, j0 + BLOCK_J, BLOCK_I):
                i = i0 + tl.arange(0, BLOCK_I)
                prev = tl.load(alpha_b + (t - 1) * size + i, mask=i < size, other=NEG_INF)
                ok = (i[:, None] < j[None, :]) & (j[None, :] < n_vert)
                edge = tl.load(links_b + i[:, None] * size + j[None, :], mask=ok, other=NEG_INF)
                x = prev[:, None] + edge  # (BI, BJ)
                tile_best, tile_arg = tl.max(x, 0, return_indices=True)  # lowest i on ties
                # Strictly greater: an earlier tile (lower i) wins ties.
                better = tile_best > best
                arg = tl.where(better, tile_arg + i0, arg)
                best = tl.where(better, tile_best, best)
            emit = tl.load(match_b + t * size + j, mask=j < n_vert, other=NEG_INF)
            tl.store(alpha_b + t * size + j, best + emit, mask=j < size)
            tl.store(back_b + t * size + j, arg, mask=j < size)
        tl.debug_barrier()
    end = tl.load(alpha_b + (n_step - 1) * size + (n_vert - 1))
    reachable = (n_step <= n_vert) & (end > NEG_INF)
    walk = tl.where(reachable, n_step, 0)
    cur = n_vert - 1
    for s in range(0, walk):
        t = n_step - 1 - s
        tl.store(path_ptr + b * size + cur, t.to(tl.int64))
        # At t = 0 this reads the unused row 0 (zeros); the loop ends there.
        cur = tl.load(back_b + t * size + cur)
