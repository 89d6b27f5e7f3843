//! Parts of a CUDA device in green contexts (CUDA 12.4+ drivers): the device's SMs
//! split into equal groups (`cuDevSmResourceSplitByCount`), one green context per
//! group (`cuGreenCtxCreate` with its default stream), each wrapped as a
//! [`CudaDevice`] of its own. Kernels are loaded into each part's context (a module
//! belongs to the context that loaded it) and run on its SMs only; memory is the
//! device's, shared with the primary context. The part's default stream is its green
//! context's own null stream, which orders nothing of the other contexts.
//!
//! SM groups follow the driver's granularity: on compute capability 9.0 and later at
//! least 8 SMs and a multiple of 8, on 8.x at least 4 and a multiple of 2; the SMs
//! left over run none of the parts' work.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, result, sys};

use super::{CudaDevice, open};
use crate::backend::GpuBackend;
use crate::error::Error;
use crate::properties::{Confinement, Part};

/// A green context, destroyed on drop.
pub(crate) struct GreenCtx(sys::CUgreenCtx);

// SAFETY: a CUgreenCtx is a driver handle usable from any thread (made current on
// one thread at a time by the part that owns it).
unsafe impl Send for GreenCtx {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for GreenCtx {}

impl Drop for GreenCtx {
    fn drop(&mut self) {
        // SAFETY: created by `cuGreenCtxCreate`, destroyed once, after everything
        // loaded in it (the owning device's other fields drop first).
        let _ = unsafe { sys::cuGreenCtxDestroy(self.0) };
    }
}

/// SMs per part for `parts` parts of `total` SMs on compute capability `major`:
/// the largest allowed group size that fits, `None` when none does.
pub(crate) fn group_size(total: u32, parts: u32, major: u32) -> Option<u32> {
    let (min, align) = if major >= 9 { (8, 8) } else { (4, 2) };
    let each = total / parts.max(1) / align * align;
    (each >= min).then_some(each)
}

/// `dev` split into `parts` green contexts.
pub(super) fn split(dev: &CudaDevice, parts: u32) -> Result<Vec<Arc<dyn GpuBackend>>, Error> {
    let what = "splitting the device into green contexts";
    let err = |e| dev.err(what)(e);
    let parent = open(dev.ordinal)?;
    dev.bind(what)?;
    let cu_device = dev.ctx.cu_device();
    // SAFETY: plain data the driver fills.
    let mut all: sys::CUdevResource = unsafe { std::mem::zeroed() };
    // SAFETY: a valid device; `all` is written.
    unsafe {
        sys::cuDeviceGetDevResource(
            cu_device,
            &mut all,
            sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
        )
    }
    .result()
    .map_err(err)?;
    // SAFETY: an SM resource: the union holds `sm`.
    let total = unsafe { all.__bindgen_anon_1.sm.smCount };
    let major = dev.props.compute_capability.map_or(8, |c| c.0);
    let each = group_size(total, parts, major).ok_or_else(|| {
        Error::Usage(format!(
            "{} has {total} SMs: {parts} green contexts of at least {} SMs do not fit",
            dev.props.name,
            if major >= 9 { 8 } else { 4 }
        ))
    })?;
    // SAFETY: plain data the driver fills.
    let mut groups: Vec<sys::CUdevResource> = vec![unsafe { std::mem::zeroed() }; parts as usize];
    let mut rest: sys::CUdevResource = unsafe { std::mem::zeroed() };
    let mut made = parts;
    // SAFETY: `groups` holds `parts` resources; `all` is the device's SM resource.
    unsafe {
        sys::cuDevSmResourceSplitByCount(groups.as_mut_ptr(), &mut made, &all, &mut rest, 0, each)
    }
    .result()
    .map_err(err)?;
    if made < parts {
        return Err(Error::Usage(format!(
            "{} split into {made} groups of {each} SMs, not {parts}",
            dev.props.name
        )));
    }
    let mut out: Vec<Arc<dyn GpuBackend>> = Vec::with_capacity(parts as usize);
    for (index, group) in groups.iter_mut().enumerate() {
        // SAFETY: plain data; the descriptor is generated from one SM group.
        let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
        unsafe { sys::cuDevResourceGenerateDesc(&mut desc, group, 1) }
            .result()
            .map_err(err)?;
        let mut green: sys::CUgreenCtx = std::ptr::null_mut();
        // SAFETY: a valid descriptor and device.
        unsafe {
            sys::cuGreenCtxCreate(
                &mut green,
                desc,
                cu_device,
                sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
            )
        }
        .result()
        .map_err(err)?;
        let green = GreenCtx(green);
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: a live green context; the handle is valid as long as it is.
        unsafe { sys::cuCtxFromGreenCtx(&mut raw, green.0) }
            .result()
            .map_err(err)?;
        // SAFETY: `raw` is a live context of `cu_device`. cudarc would destroy it
        // with `cuCtxDestroy` when its last handle goes, which is not how a green
        // context ends: one handle is leaked so that never happens, and `GreenCtx`
        // destroys the context instead.
        let ctx =
            unsafe { CudaContext::from_raw_context(dev.ordinal, cu_device, raw) }.map_err(err)?;
        std::mem::forget(ctx.clone());
        // SAFETY: an SM resource.
        let sms = unsafe { group.__bindgen_anon_1.sm.smCount };
        let mut props = dev.props.clone();
        props.multiprocessors = sms;
        props.part = Some(Part {
            index: index as u32,
            parts,
            confinement: Confinement::GreenContext,
        });
        out.push(Arc::new(CudaDevice {
            ordinal: dev.ordinal,
            ctx,
            props,
            async_alloc: dev.async_alloc,
            kernels: Mutex::new(HashMap::new()),
            control: Mutex::new(None),
            tensor_maps: Mutex::new(HashMap::new()),
            parent: Some(parent.clone()),
            _green: Some(green),
        }));
    }
    // The primary context stays current on this thread, as callers expect.
    // SAFETY: the device's primary context is alive (held by `dev`).
    let _ = unsafe { result::ctx::set_current(dev.ctx.cu_ctx()) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::group_size;

    #[test]
    fn groups_follow_the_drivers_granularity() {
        // H100 SXM: 132 SMs.
        assert_eq!(group_size(132, 4, 9), Some(32));
        assert_eq!(group_size(132, 8, 9), Some(16));
        assert_eq!(group_size(132, 16, 9), Some(8));
        assert_eq!(group_size(132, 17, 9), None);
        // A100: 108 SMs.
        assert_eq!(group_size(108, 4, 8), Some(26));
        assert_eq!(group_size(108, 27, 8), Some(4));
        assert_eq!(group_size(108, 28, 8), None);
    }
}
