import triton
import triton.language as tl
from triton.language.extra import libdevice

@triton.jit
def _relu(x):
    return tl.where(x != x, x, tl.maximum(x, 0))

@triton.jit
def kiln_pointwise_add_ff8254ed08(pid, in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xoffset = pid.to(tl.int32) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + xindex, xmask, other=0)
    tmp1 = tl.full([], 2.0, tl.float32)
    tmp2 = (tmp0 * tmp1)
    tmp3 = tl.full([], 1.0, tl.float32)
    tmp4 = (tmp2 + tmp3)
    tl.store(out_ptr0 + xindex, tl.broadcast_to(tmp4, [XBLOCK]).to(tl.float32), xmask)

@triton.jit
def kiln_pointwise_relu_dcc34711c9(pid, in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xoffset = pid.to(tl.int32) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + xindex, xmask, other=0)
    tmp1 = tl.load(in_ptr1 + xindex, xmask, other=0)
    tmp2 = (tmp0 - tmp1)
    tmp3 = _relu(tmp2)
    tl.store(out_ptr0 + xindex, tl.broadcast_to(tmp3, [XBLOCK]).to(tl.float32), xmask)

@triton.jit
def kiln_pointwise_mul_1_eb21a0f0cf(pid, in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xoffset = pid.to(tl.int32) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + xindex, xmask, other=0)
    tmp1 = (1.0 / (1.0 + tl.exp(-tmp0)))
    tmp2 = tl.full([], 3.0, tl.float32)
    tmp3 = (tmp1 * tmp2)
    tl.store(out_ptr0 + xindex, tl.broadcast_to(tmp3, [XBLOCK]).to(tl.float32), xmask)


@triton.jit
def kiln_combo3_8ccb4fbbec(in_ptr0_p0, out_ptr0_p0, in_ptr0_p1, in_ptr1_p1, out_ptr0_p1, in_ptr0_p2, out_ptr0_p2, xnumel_p0, xnumel_p1, xnumel_p2, XBLOCK_p0: tl.constexpr, XBLOCK_p1: tl.constexpr, XBLOCK_p2: tl.constexpr):
    # part 0: kiln_pointwise_add_ff8254ed08
    # part 1: kiln_pointwise_relu_dcc34711c9
    # part 2: kiln_pointwise_mul_1_eb21a0f0cf
    pid = tl.program_id(0).to(tl.int32)
    end0 = tl.cdiv(xnumel_p0, XBLOCK_p0)
    end1 = end0 + tl.cdiv(xnumel_p1, XBLOCK_p1)
    end2 = end1 + tl.cdiv(xnumel_p2, XBLOCK_p2)
    if pid < end0:
        kiln_pointwise_add_ff8254ed08(pid, in_ptr0_p0, out_ptr0_p0, xnumel_p0, XBLOCK_p0)
    elif pid < end1:
        kiln_pointwise_relu_dcc34711c9(pid - end0, in_ptr0_p1, in_ptr1_p1, out_ptr0_p1, xnumel_p1, XBLOCK_p1)
    elif pid < end2:
        kiln_pointwise_mul_1_eb21a0f0cf(pid - end1, in_ptr0_p2, out_ptr0_p2, xnumel_p2, XBLOCK_p2)
