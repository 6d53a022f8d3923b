#!/usr/bin/python3
"""emulate_attention_fragments.py: runs the index arithmetic of cuda/attention.cu's register-tiled
16-bit attention kernels (Note [register-tiled attention]) on the CPU, in float64, one warp at a
time, against a float64 composition of attention and its gradients.

What it checks: that the kernels' ldmatrix row addresses, the order of fragment registers (S's C
fragments packed into P's A fragments, and so on), the masks and the online softmax fit together,
given the fragment layouts that PTX documents for ldmatrix (.trans or not) and mma.sync.m16n8k16
(modelled by ldmatrix() and mma() below). What it cannot check: the PTX layouts themselves, rounding
to 16 bits, cp.async and the barriers
those the GPU tests check (tests/cuda/test_cuda_transformer.cpp,
scripts/gpu_check.sh). The functions forward, grad_q and grad_kv transcribe the kernels
attention_forward_mma_kernel, attention_grad_q_mma_kernel and attention_grad_kv_mma_kernel line for
line (lanes as a loop, registers as arrays): change them together. Needs numpy (python3-numpy;
without it the script exits 77, which CTest reports as skipped). Prints the largest error of each
case and exits non-zero if one exceeds 1e-12. CTest runs it.

  /usr/bin/python3 scripts/emulate_attention_fragments.py
"""
import sys

try:
    import numpy as np
except ImportError:
    print("emulate_attention_fragments.py: numpy is missing (python3-numpy); skipped")
    sys.exit(77)  # CTest: skipped

kTile = 64  # keys (forward, dQ) or queries (dK, dV) per step of the walk
kRows = 64  # rows of a block: 4 warps of 16
kLog2e = 1.0 / np.log(2.0)  # Note [exp2 in the register-tiled kernels]: scores in units of log2
kLn2 = np.log(2.0)

def ldmatrix(sm, addr, trans):
    """ldmatrix.x4 from shared memory sm: lanes 8i..8i+7 give (row, col) of matrix i's 8 rows (addr(lane));
    returns regs[lane][i] = the two values lane 4g+t holds of matrix i: row g, columns 2t, 2t+1
    (trans: column g, rows 2t, 2t+1)."""
    rows = [[sm[addr(8*i + r)[0], addr(8*i + r)[1]:addr(8*i + r)[1]+8] for r in range(8)] for i in range(4)]
    out = np.zeros((32, 4, 2))
    for L in range(32):
        g, t = L // 4, L % 4
        for i in range(4):
            if not trans: out[L, i] = rows[i][g][2*t:2*t+2]
            else: out[L, i] = [rows[i][2*t][g], rows[i][2*t+1][g]]
    return out


def mma(d, a, b0, b1):
    """mma.sync.m16n8k16: d (per lane 4 floats: C) += A (per lane 4 registers of 2) B (b0, b1: 2 each)."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    C = np.zeros((16, 8))
    for L in range(32):
        g, t = L // 4, L % 4
        A[g, 2*t:2*t+2] = a[L][0]
        A[g+8, 2*t:2*t+2] = a[L][1]
        A[g, 2*t+8:2*t+10] = a[L][2]
        A[g+8, 2*t+8:2*t+10] = a[L][3]
        B[2*t:2*t+2, g] = b0[L]
        B[2*t+8:2*t+10, g] = b1[L]
        C[g, 2*t:2*t+2] = d[L][0:2]
        C[g+8, 2*t:2*t+2] = d[L][2:4]
    D = A @ B + C
    for L in range(32):
        g, t = L // 4, L % 4
        d[L][0:2] = D[g, 2*t:2*t+2]
        d[L][2:4] = D[g+8, 2*t:2*t+2]


def for_each_a_register():
    """for_each_a_register: (j, r, n, h) for A register r = 2 half + h of fragment j, from C tile
    n = 2j + half, row g + 8h."""
    for j in range(kTile // 16):
        for half in range(2):
            for h in range(2):
                yield j, 2*half + h, 2*j + half, h


def rows_times_tile_t(acc, a_sm, a_row0, b_sm, D):
    """rows_times_tile_t_mma: acc[lane][8 tiles][4] += A B^T, 16 rows of a_sm from a_row0, 64 of b_sm."""
    for kk in range(D // 16):
        fa = ldmatrix(a_sm, lambda l: (a_row0 + (l & 15), kk*16 + (l >> 4)*8), False)
        for j in range(kTile // 16):
            fb = ldmatrix(b_sm, lambda l: (16*j + (l & 7) + (l >> 4)*8, kk*16 + ((l >> 3) & 1)*8), False)
            d0 = [acc[L][2*j] for L in range(32)]
            d1 = [acc[L][2*j+1] for L in range(32)]
            mma(d0, fa, fb[:, 0], fb[:, 1])
            mma(d1, fa, fb[:, 2], fb[:, 3])


def acc_p_times(acc, p, m_sm, D):
    """accumulate_p_times_mma: acc[lane][D/8 tiles][4] += P M, P as A fragments p[lane][4][4][2]."""
    for j in range(kTile // 16):
        for u in range(D // 16):
            fb = ldmatrix(m_sm, lambda l: (16*j + (l & 15), 16*u + (l >> 4)*8), True)
            pa = [p[L][j] for L in range(32)]
            d0 = [acc[L][2*u] for L in range(32)]
            d1 = [acc[L][2*u+1] for L in range(32)]
            mma(d0, pa, fb[:, 0], fb[:, 1])
            mma(d1, pa, fb[:, 2], fb[:, 3])


def visible_keys(i, k0, S, causal):
    """visible_keys: query i sees columns c < this of the key tile at k0 (clamped to [0, kTile])."""
    end = i + 1 if causal and i + 1 < S else S
    return max(0, min(kTile, end - k0))


def tile_of(x, row0, rows, D):
    """load_tile_async: rows row0 .. row0+63 of x, zeros past `rows`."""
    t = np.zeros((kRows, D))
    n = max(0, min(kRows, rows - row0))
    t[:n] = x[row0:row0+n]
    return t


def forward(q, k, v, scale, causal, q0, warp):
    """attention_forward_mma_kernel's warp `warp` of the block at query q0: its 16 rows of out and lse."""
    L, D = q.shape
    S = k.shape[0]
    qs = tile_of(q, q0, L, D)
    scale_log2 = scale * kLog2e
    o = np.zeros((32, D // 8, 4))
    m = np.full((32, 2), -np.inf)
    l = np.zeros((32, 2))
    kend = q0 + kRows if causal and q0 + kRows < S else S
    for k0 in range(0, kend, kTile):
        ks = tile_of(k, k0, S, D)
        vs = tile_of(v, k0, S, D)
        s = np.zeros((32, 8, 4))
        rows_times_tile_t(s, qs, warp*16, ks, D)
        edge = (causal and k0 + kTile > q0) or k0 + kTile > S
        p = np.zeros((32, 4, 4, 2))
        for L in range(32):
            g, t = L // 4, L % 4
            row = q0 + warp*16 + g
            visible = [visible_keys(row + 8*h, k0, S, causal) if edge else kTile for h in range(2)]
            for n in range(8):
                for e in range(4):
                    c = 8*n + 2*t + (e & 1)
                    s[L][n][e] = -np.inf if c >= visible[e >> 1] else s[L][n][e]*scale_log2
        mx = np.full((32, 2), -np.inf)
        for L in range(32):
            for n in range(8):
                for e in range(4): mx[L][e >> 1] = max(mx[L][e >> 1], s[L][n][e])
        for L in range(32):  # quad reduce
            for h in range(2): mx[L][h] = max(mx[4*(L//4) + x][h] for x in range(4))
        alpha = np.ones((32, 2))
        for L in range(32):
            for h in range(2):
                mn = max(m[L][h], mx[L][h])
                alpha[L][h] = 1 if mn == -np.inf else np.exp2(m[L][h] - mn)
                m[L][h] = mn
                l[L][h] *= alpha[L][h]
        for L in range(32):
            for j, r, n, h in for_each_a_register():
                mh = 0 if m[L][h] == -np.inf else m[L][h]
                p[L][j][r] = np.exp2(s[L][n][2*h:2*h+2] - mh)
                l[L][h] += p[L][j][r].sum()
        for L in range(32):
            for n in range(D // 8):
                o[L][n][0:2] *= alpha[L][0]
                o[L][n][2:4] *= alpha[L][1]
        acc_p_times(o, p, vs, D)
    out = np.full((16, D), np.nan)
    lse = np.full(16, np.nan)
    for L in range(32):
        g, t = L // 4, L % 4
        for h in range(2):
            lt = sum(l[4*(L//4) + x][h] for x in range(4))
            for n in range(D // 8): out[g + 8*h, 8*n + 2*t: 8*n + 2*t + 2] = o[L][n][2*h:2*h+2] / lt
            lse[g + 8*h] = m[L][h]*kLn2 + np.log(lt)
    return out, lse


def warp_rows(acc, D):
    """The warp's 16 rows of D columns held in the C fragments acc[lane][n][4] (as the kernels store them)."""
    rows = np.full((16, D), np.nan)
    for Ln in range(32):
        g, t = Ln // 4, Ln % 4
        for h in range(2):
            for n in range(D // 8): rows[g+8*h, 8*n+2*t:8*n+2*t+2] = acc[Ln][n][2*h:2*h+2]
    return rows


def grad_kv(q, k, v, go, lse, delta, scale, causal, k0, warp):
    """attention_grad_kv_mma_kernel's warp `warp` of the block at key k0: its 16 rows of dK and dV."""
    L, D = q.shape
    S = k.shape[0]
    ks = tile_of(k, k0, S, D)
    vs = tile_of(v, k0, S, D)
    scale_log2 = scale * kLog2e
    dk = np.zeros((32, D // 8, 4))
    dv = np.zeros((32, D // 8, 4))
    qstart = k0 if causal else 0
    for q0 in range(qstart, L, kTile):
        qs = tile_of(q, q0, L, D)
        gos = tile_of(go, q0, L, D)
        lse_s = [lse[q0+i]*kLog2e if q0+i < L else 0 for i in range(kTile)]
        delta_s = [delta[q0+i] if q0+i < L else 0 for i in range(kTile)]
        st = np.zeros((32, 8, 4))
        dpt = np.zeros((32, 8, 4))
        rows_times_tile_t(st, ks, warp*16, qs, D)
        rows_times_tile_t(dpt, vs, warp*16, gos, D)
        edge = (causal and q0 < k0 + kRows) or q0 + kTile > L
        pt = np.zeros((32, 4, 4, 2))
        dst = np.zeros((32, 4, 4, 2))
        last = min(L - q0, kTile) if edge else kTile
        for Ln in range(32):
            g, t = Ln // 4, Ln % 4
            key = k0 + warp*16 + g
            first = [max(0, min(kTile, key + 8*h - q0)) if edge and causal else 0 for h in range(2)]
            for j, r, n, h in for_each_a_register():
                for e in range(2):
                    c = 8*n + 2*t + e
                    hidden = c >= last or c < first[h]
                    p = 0 if hidden else np.exp2(st[Ln][n][2*h+e]*scale_log2 - lse_s[c])
                    pt[Ln][j][r][e] = p
                    dst[Ln][j][r][e] = p*(dpt[Ln][n][2*h+e] - delta_s[c])
        acc_p_times(dv, pt, gos, D)
        acc_p_times(dk, dst, qs, D)
    return warp_rows(dk, D) * scale, warp_rows(dv, D)


def grad_q(q, k, v, go, lse, delta, scale, causal, q0, warp):
    """attention_grad_q_mma_kernel's warp `warp` of the block at query q0: its 16 rows of dQ."""
    L, D = q.shape
    S = k.shape[0]
    qs = tile_of(q, q0, L, D)
    gos = tile_of(go, q0, L, D)
    scale_log2 = scale * kLog2e
    dq = np.zeros((32, D // 8, 4))
    kend = q0 + kRows if causal and q0 + kRows < S else S
    for k0 in range(0, kend, kTile):
        ks = tile_of(k, k0, S, D)
        vs = tile_of(v, k0, S, D)
        s = np.zeros((32, 8, 4))
        dp = np.zeros((32, 8, 4))
        rows_times_tile_t(s, qs, warp*16, ks, D)
        rows_times_tile_t(dp, gos, warp*16, vs, D)
        edge = (causal and k0 + kTile > q0) or k0 + kTile > S
        ds = np.zeros((32, 4, 4, 2))
        for Ln in range(32):
            g, t = Ln // 4, Ln % 4
            row = q0 + warp*16 + g
            visible = [visible_keys(row + 8*h, k0, S, causal) if edge else kTile for h in range(2)]
            for j, r, n, h in for_each_a_register():
                lr = lse[row+8*h]*kLog2e if row+8*h < L else 0
                dr = delta[row+8*h] if row+8*h < L else 0
                for e in range(2):
                    p = 0 if 8*n + 2*t + e >= visible[h] else np.exp2(s[Ln][n][2*h+e]*scale_log2 - lr)
                    ds[Ln][j][r][e] = p*(dp[Ln][n][2*h+e] - dr)
        acc_p_times(dq, ds, ks, D)
    return warp_rows(dq, D) * scale



def main():
    rng = np.random.default_rng(0)
    worst = 0.0
    # Lengths that leave partial tiles, L != S both ways, causal and not; D = 32 keeps it quick (the
    # head dim enters only as the count of 16-wide steps). Also: causal with key blocks past every
    # query (7 x 130: the dK/dV walk has no tile), blocks whose warps are all padding (1 x 1), and a
    # head dim of 96 (six 16-wide steps).
    for (L, S, D, causal) in [(70, 70, 32, True), (70, 130, 32, False), (130, 70, 32, True), (100, 100, 32, False),
                              (64, 64, 64, True), (7, 130, 32, True), (1, 1, 32, True), (20, 20, 96, False)]:
        q, k, v, go = (rng.standard_normal((n, D)) for n in (L, S, S, L))
        scale = 1 / np.sqrt(D)
        sc = q @ k.T * scale
        if causal:
            sc = np.where(np.arange(S)[None, :] > np.arange(L)[:, None], -np.inf, sc)
        mx = sc.max(1, keepdims=True)
        lse_ref = np.log(np.exp(sc - mx).sum(1)) + mx[:, 0]
        P = np.exp(sc - lse_ref[:, None])
        O = P @ v
        delta = (go * O).sum(1)
        dS = P * (go @ v.T - delta[:, None]) * scale
        dQ, dK, dV = dS @ k, dS.T @ q, P.T @ go
        errs = {"out": 0.0, "lse": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0}
        for q0 in range(0, L, kRows):
            for w in range(4):
                r0 = q0 + 16 * w
                if r0 >= L:
                    continue
                n = min(16, L - r0)
                out, lse = forward(q, k, v, scale, causal, q0, w)
                gq = grad_q(q, k, v, go, lse_ref, delta, scale, causal, q0, w)
                errs["out"] = max(errs["out"], np.abs(out[:n] - O[r0:r0 + n]).max())
                errs["lse"] = max(errs["lse"], np.abs(lse[:n] - lse_ref[r0:r0 + n]).max())
                errs["dq"] = max(errs["dq"], np.abs(gq[:n] - dQ[r0:r0 + n]).max())
        for k0 in range(0, S, kRows):
            for w in range(4):
                r0 = k0 + 16 * w
                if r0 >= S:
                    continue
                n = min(16, S - r0)
                gk, gv = grad_kv(q, k, v, go, lse_ref, delta, scale, causal, k0, w)
                errs["dk"] = max(errs["dk"], np.abs(gk[:n] - dK[r0:r0 + n]).max())
                errs["dv"] = max(errs["dv"], np.abs(gv[:n] - dV[r0:r0 + n]).max())
        print(f"L {L}, S {S}, D {D}, causal {causal}: largest error " +
              ", ".join(f"{name} {e:.1e}" for name, e in errs.items()))
        worst = max(worst, *errs.values())
    if not worst < 1e-12:
        print(f"FAIL: an error of {worst:.2e}")
        return 1
    print("all within 1e-12")
    return 0


if __name__ == "__main__":
    sys.exit(main())
