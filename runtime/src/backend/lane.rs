//! Parts of one GPU ([`crate::Device::partition`]): several ranks of a world on one
//! GPU, each with its own stream and its own share of the multiprocessors, so that
//! every rank's waiting kernels are resident at once and run concurrently.
//!
//! [`partition`] asks the backend for parts the hardware keeps apart (CUDA green
//! contexts, [`GpuBackend::confined_parts`]); otherwise, or when that fails, each
//! part is a [`Lane`]: the same device behind a stream of its own that waits for no
//! other ([`GpuBackend::part_stream`], with a CU mask on AMD), whose properties
//! report the part's share of the multiprocessors. The residency check of a waiting
//! kernel ([`GpuBackend::check_launch`]) then holds each part to its share, so the programs of
//! all parts fit on the device together.

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{
    GpuArg, GpuBackend, GpuKernel, GridLimits, KernelBinary, RawEvent, RawStream, TensorMap,
    TensorMapSpec,
};
use crate::error::Error;
use crate::properties::{Confinement, DeviceKind, DeviceProperties, Part};

/// The multiprocessors of part `index` of `parts` on a device of `units`: equal
/// shares, the remainder unused.
pub(crate) fn share(units: u32, parts: u32, index: u32) -> Range<u32> {
    let each = units / parts.max(1);
    index * each..(index + 1) * each
}

/// `gpu` split into `parts` devices: parts the hardware confines where `confined`
/// and the backend has them, else [`Lane`]s. Every part reports its share in
/// `props().multiprocessors` and which part it is in `props().part`.
pub(crate) fn partition(
    gpu: &Arc<dyn GpuBackend>,
    parts: u32,
    confined: bool,
) -> Result<Vec<Arc<dyn GpuBackend>>, Error> {
    let units = gpu.props().multiprocessors;
    if parts == 0 || parts > units {
        return Err(Error::Usage(format!(
            "{} has {units} multiprocessors: it splits into 1 to {units} parts, not {parts}",
            gpu.id()
        )));
    }
    if confined {
        match gpu.confined_parts(parts) {
            Some(Ok(v)) => return Ok(v),
            Some(Err(e)) => log::warn!(
                "{}: no green contexts ({e}); its {parts} parts are streams with sized launches",
                gpu.id()
            ),
            None => {}
        }
    }
    (0..parts)
        .map(|i| Lane::new(gpu, i, parts).map(|l| Arc::new(l) as Arc<dyn GpuBackend>))
        .collect()
}

/// One part of a GPU: the device behind a stream of its own (see the module docs).
/// Work queued on its default stream goes to that stream; [`GpuBackend::synchronize_device`]
/// waits for its own streams only, never for another part's (whose kernels may be
/// waiting for this part's next one).
pub(crate) struct Lane {
    inner: Arc<dyn GpuBackend>,
    /// Its default stream.
    stream: RawStream,
    props: DeviceProperties,
    /// The streams made through it ([`GpuBackend::stream_create`]), which
    /// `synchronize_device` waits for too.
    streams: Mutex<Vec<RawStream>>,
}

impl Lane {
    /// Part `index` of `parts` of `inner`.
    pub(crate) fn new(inner: &Arc<dyn GpuBackend>, index: u32, parts: u32) -> Result<Lane, Error> {
        let units = share(inner.props().multiprocessors, parts, index);
        let (stream, masked) = inner.part_stream(units.clone())?;
        let mut props = inner.props().clone();
        props.multiprocessors = units.len() as u32;
        props.part = Some(Part {
            index,
            parts,
            confinement: if masked {
                Confinement::CuMask
            } else {
                Confinement::Sized
            },
        });
        Ok(Lane {
            inner: inner.clone(),
            stream,
            props,
            streams: Mutex::new(Vec::new()),
        })
    }

    /// `stream`, with the default stream meaning this lane's.
    fn on(&self, stream: RawStream) -> RawStream {
        if stream == RawStream::DEFAULT {
            self.stream
        } else {
            stream
        }
    }

    fn lock_streams(&self) -> std::sync::MutexGuard<'_, Vec<RawStream>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // The driver lets the stream's queued work finish.
        self.inner.stream_destroy(self.stream);
    }
}

impl GpuBackend for Lane {
    fn kind(&self) -> DeviceKind {
        self.inner.kind()
    }
    fn ordinal(&self) -> usize {
        self.inner.ordinal()
    }
    fn props(&self) -> &DeviceProperties {
        &self.props
    }
    /// The device's own type (peer access, interop and NVSHMEM reach it).
    fn as_any(&self) -> &dyn std::any::Any {
        self.inner.as_any()
    }
    fn alloc(&self, bytes: usize, stream: RawStream) -> Result<u64, Error> {
        self.inner.alloc(bytes, self.on(stream))
    }
    fn free(&self, ptr: u64, stream: RawStream) {
        self.inner.free(ptr, self.on(stream))
    }
    fn alloc_exportable(&self, bytes: usize) -> Result<u64, Error> {
        self.inner.alloc_exportable(bytes)
    }
    fn free_exportable(&self, ptr: u64) {
        self.inner.free_exportable(ptr)
    }
    fn htod(&self, dst: u64, data: &[u8], stream: RawStream) -> Result<(), Error> {
        self.inner.htod(dst, data, self.on(stream))
    }
    fn dtoh(&self, src: u64, out: &mut [u8], stream: RawStream) -> Result<(), Error> {
        self.inner.dtoh(src, out, self.on(stream))
    }
    fn copy(
        &self,
        dst: u64,
        src_dev: &dyn GpuBackend,
        src: u64,
        bytes: usize,
        stream: RawStream,
    ) -> Result<(), Error> {
        self.inner.copy(dst, src_dev, src, bytes, self.on(stream))
    }
    fn poke_u32(&self, dst: u64, value: u32) -> Result<(), Error> {
        self.inner.poke_u32(dst, value)
    }
    fn synchronize(&self, stream: RawStream) -> Result<(), Error> {
        self.inner.synchronize(self.on(stream))
    }
    fn synchronize_device(&self) -> Result<(), Error> {
        self.inner.synchronize(self.stream)?;
        let streams = self.lock_streams().clone();
        streams
            .into_iter()
            .try_for_each(|s| self.inner.synchronize(s))
    }
    /// A stream of this part: like its default stream, it waits for no other.
    fn stream_create(&self) -> Result<RawStream, Error> {
        let part = self.props.part.map_or(0, |p| p.index);
        let parts = self.props.part.map_or(1, |p| p.parts);
        let units = share(self.inner.props().multiprocessors, parts, part);
        let (s, _) = self.inner.part_stream(units)?;
        self.lock_streams().push(s);
        Ok(s)
    }
    fn stream_destroy(&self, stream: RawStream) {
        if stream == RawStream::DEFAULT {
            return;
        }
        self.lock_streams().retain(|&s| s != stream);
        self.inner.stream_destroy(stream)
    }
    fn event_create(&self) -> Result<RawEvent, Error> {
        self.inner.event_create()
    }
    fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<(), Error> {
        self.inner.event_record(event, self.on(stream))
    }
    fn event_synchronize(&self, event: RawEvent) -> Result<(), Error> {
        self.inner.event_synchronize(event)
    }
    fn event_elapsed(&self, start: RawEvent, end: RawEvent) -> Result<Duration, Error> {
        self.inner.event_elapsed(start, end)
    }
    fn event_destroy(&self, event: RawEvent) {
        self.inner.event_destroy(event)
    }
    fn load(
        &self,
        key: &str,
        bin: &mut dyn FnMut() -> Result<KernelBinary, Error>,
    ) -> Result<Arc<dyn GpuKernel>, Error> {
        self.inner.load(key, bin)
    }
    fn occupancy(&self, kernel: &dyn GpuKernel) -> Result<u32, Error> {
        self.inner.occupancy(kernel)
    }
    /// Checked against this part's share first (a waiting kernel's programs must fit
    /// in it), then launched on the device.
    fn launch(
        &self,
        kernel: &dyn GpuKernel,
        grid: [u32; 3],
        cluster: [u32; 3],
        args: &[GpuArg],
        waits: bool,
        stream: RawStream,
    ) -> Result<(), Error> {
        let limits = match self.kind() {
            DeviceKind::Hip => GridLimits::Hip,
            _ => GridLimits::Cuda,
        };
        self.check_launch(kernel, grid, waits, limits)?;
        self.inner
            .launch(kernel, grid, cluster, args, waits, self.on(stream))
    }
    fn tensor_map(&self, spec: &TensorMapSpec<'_>) -> Result<Option<TensorMap>, Error> {
        self.inner.tensor_map(spec)
    }
    fn part_stream(&self, units: Range<u32>) -> Result<(RawStream, bool), Error> {
        self.inner.part_stream(units)
    }
    fn enable_peer_access(&self, other: &dyn GpuBackend) -> Result<(), Error> {
        self.inner.enable_peer_access(other)
    }
    fn ipc_handle(&self, ptr: u64) -> Result<Vec<u8>, Error> {
        self.inner.ipc_handle(ptr)
    }
    fn ipc_open(&self, handle: &[u8]) -> Result<u64, Error> {
        self.inner.ipc_open(handle)
    }
    fn ipc_close(&self, ptr: u64) {
        self.inner.ipc_close(ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU of 132 SMs that records what it is asked to do.
    struct Fake {
        props: DeviceProperties,
        log: Mutex<Vec<String>>,
        next_stream: std::sync::atomic::AtomicU64,
    }

    impl Fake {
        fn backend() -> Arc<dyn GpuBackend> {
            Arc::new(Fake {
                props: DeviceProperties {
                    name: "Fake H100".into(),
                    target: "sm_90a".into(),
                    compute_capability: Some((9, 0)),
                    driver_version: Some((12, 8)),
                    multiprocessors: 132,
                    warp_size: 32,
                    shared_per_block: 48 << 10,
                    shared_per_block_optin: 227 << 10,
                    total_memory: 80 << 30,
                    part: None,
                },
                log: Mutex::new(Vec::new()),
                next_stream: std::sync::atomic::AtomicU64::new(100),
            })
        }
    }

    fn log_of(g: &Arc<dyn GpuBackend>) -> Vec<String> {
        let f = g.as_any().downcast_ref::<Fake>().expect("the fake");
        f.log.lock().unwrap().clone()
    }

    struct FakeKernel(KernelBinary);
    impl GpuKernel for FakeKernel {
        fn binary(&self) -> &KernelBinary {
            &self.0
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    impl Fake {
        fn note(&self, what: String) {
            self.log.lock().unwrap().push(what);
        }
    }

    impl GpuBackend for Fake {
        fn kind(&self) -> DeviceKind {
            DeviceKind::Cuda
        }
        fn ordinal(&self) -> usize {
            0
        }
        fn props(&self) -> &DeviceProperties {
            &self.props
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn alloc(&self, _: usize, s: RawStream) -> Result<u64, Error> {
            self.note(format!("alloc on {}", s.0));
            Ok(4096)
        }
        fn free(&self, _: u64, s: RawStream) {
            self.note(format!("free on {}", s.0));
        }
        fn alloc_exportable(&self, _: usize) -> Result<u64, Error> {
            Ok(8192)
        }
        fn free_exportable(&self, _: u64) {}
        fn htod(&self, _: u64, _: &[u8], s: RawStream) -> Result<(), Error> {
            self.note(format!("htod on {}", s.0));
            Ok(())
        }
        fn dtoh(&self, _: u64, _: &mut [u8], s: RawStream) -> Result<(), Error> {
            self.note(format!("dtoh on {}", s.0));
            Ok(())
        }
        fn copy(
            &self,
            _: u64,
            _: &dyn GpuBackend,
            _: u64,
            _: usize,
            s: RawStream,
        ) -> Result<(), Error> {
            self.note(format!("copy on {}", s.0));
            Ok(())
        }
        fn poke_u32(&self, _: u64, _: u32) -> Result<(), Error> {
            Ok(())
        }
        fn synchronize(&self, s: RawStream) -> Result<(), Error> {
            self.note(format!("sync {}", s.0));
            Ok(())
        }
        fn synchronize_device(&self) -> Result<(), Error> {
            self.note("sync device".into());
            Ok(())
        }
        fn stream_create(&self) -> Result<RawStream, Error> {
            unreachable!("parts make their streams with part_stream")
        }
        fn stream_destroy(&self, s: RawStream) {
            self.note(format!("destroy {}", s.0));
        }
        fn event_create(&self) -> Result<RawEvent, Error> {
            Ok(RawEvent(1))
        }
        fn event_record(&self, _: RawEvent, s: RawStream) -> Result<(), Error> {
            self.note(format!("record on {}", s.0));
            Ok(())
        }
        fn event_synchronize(&self, _: RawEvent) -> Result<(), Error> {
            Ok(())
        }
        fn event_elapsed(&self, _: RawEvent, _: RawEvent) -> Result<Duration, Error> {
            Ok(Duration::ZERO)
        }
        fn event_destroy(&self, _: RawEvent) {}
        fn load(
            &self,
            _: &str,
            bin: &mut dyn FnMut() -> Result<KernelBinary, Error>,
        ) -> Result<Arc<dyn GpuKernel>, Error> {
            Ok(Arc::new(FakeKernel(bin()?)))
        }
        fn occupancy(&self, _: &dyn GpuKernel) -> Result<u32, Error> {
            Ok(2)
        }
        fn launch(
            &self,
            _: &dyn GpuKernel,
            grid: [u32; 3],
            _: [u32; 3],
            _: &[GpuArg],
            _: bool,
            s: RawStream,
        ) -> Result<(), Error> {
            self.note(format!("launch {} on {}", grid[0], s.0));
            Ok(())
        }
        fn part_stream(&self, units: Range<u32>) -> Result<(RawStream, bool), Error> {
            let s = self
                .next_stream
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.note(format!("part stream {s} for SMs {units:?}"));
            Ok((RawStream(s), false))
        }
        fn confined_parts(&self, _: u32) -> Option<Result<Vec<Arc<dyn GpuBackend>>, Error>> {
            Some(Err(Error::Usage("no green contexts on a fake".into())))
        }
        fn enable_peer_access(&self, _: &dyn GpuBackend) -> Result<(), Error> {
            Ok(())
        }
        fn ipc_handle(&self, _: u64) -> Result<Vec<u8>, Error> {
            Ok(vec![0; 64])
        }
        fn ipc_open(&self, _: &[u8]) -> Result<u64, Error> {
            Ok(0)
        }
        fn ipc_close(&self, _: u64) {}
    }

    fn kernel(g: &Arc<dyn GpuBackend>) -> Arc<dyn GpuKernel> {
        g.load("k", &mut || {
            Ok(KernelBinary {
                name: "ring".into(),
                target: "sm_90a".into(),
                num_threads: 128,
                shared_bytes: 0,
                binary: Vec::new(),
            })
        })
        .expect("loads")
    }

    #[test]
    fn a_lane_is_its_own_stream_and_share_of_the_device() {
        let gpu = Fake::backend();
        // Green contexts refused: the parts fall back to lanes, in equal shares.
        let parts = partition(&gpu, 4, true).expect("4 parts");
        assert_eq!(parts.len(), 4);
        for (i, p) in parts.iter().enumerate() {
            assert_eq!(p.props().multiprocessors, 33);
            assert_eq!(
                p.props().part,
                Some(Part {
                    index: i as u32,
                    parts: 4,
                    confinement: Confinement::Sized
                })
            );
        }
        let log = log_of(&gpu);
        assert_eq!(log[0], "part stream 100 for SMs 0..33");
        assert_eq!(log[3], "part stream 103 for SMs 99..132");
        let lane = &parts[2];
        // The default stream is the lane's; a named stream is kept.
        lane.htod(0, &[1], RawStream::DEFAULT).unwrap();
        lane.dtoh(0, &mut [0], RawStream(7)).unwrap();
        lane.alloc(16, RawStream::DEFAULT).unwrap();
        lane.free(4096, RawStream::DEFAULT);
        lane.event_record(RawEvent(1), RawStream::DEFAULT).unwrap();
        // The device's synchronization waits for this part's streams only.
        lane.synchronize_device().unwrap();
        let k = kernel(lane);
        // 33 SMs x 2 programs each: 66 waiting programs fit, 67 do not; a kernel
        // that does not wait is not held to the share.
        lane.launch(
            k.as_ref(),
            [66, 1, 1],
            [1, 1, 1],
            &[],
            true,
            RawStream::DEFAULT,
        )
        .unwrap();
        let e = lane
            .launch(
                k.as_ref(),
                [67, 1, 1],
                [1, 1, 1],
                &[],
                true,
                RawStream::DEFAULT,
            )
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("at most 66 (2 per multiprocessor x 33)"),
            "{e}"
        );
        lane.launch(
            k.as_ref(),
            [67, 1, 1],
            [1, 1, 1],
            &[],
            false,
            RawStream::DEFAULT,
        )
        .unwrap();
        let log = log_of(&gpu);
        assert_eq!(
            log[4..],
            [
                "htod on 102",
                "dtoh on 7",
                "alloc on 102",
                "free on 102",
                "record on 102",
                "sync 102",
                "launch 66 on 102",
                "launch 67 on 102",
            ]
        );
        drop(parts);
        let log = log_of(&gpu);
        assert_eq!(
            log.iter().filter(|l| l.starts_with("destroy 10")).count(),
            4
        );
    }

    #[test]
    fn a_device_splits_into_1_to_its_sm_count_parts() {
        let gpu = Fake::backend();
        for bad in [0, 133] {
            let e = partition(&gpu, bad, false).err().expect("refused");
            assert!(e.to_string().contains("1 to 132 parts"), "{e}");
        }
        assert_eq!(partition(&gpu, 132, false).expect("one SM each").len(), 132);
    }

    #[test]
    fn shares_are_equal_and_disjoint() {
        assert_eq!(share(132, 4, 0), 0..33);
        assert_eq!(share(132, 4, 3), 99..132);
        assert_eq!(share(132, 8, 7), 112..128);
        let all: Vec<Range<u32>> = (0..5).map(|i| share(304, 5, i)).collect();
        for w in all.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
    }
}
