//! Several ranks on one device (`World::local(n).on(&device)`): each rank gets a part
//! of the device (`Device::partition`: its own stream and share of the
//! multiprocessors), a waiting kernel must fit in its rank's share, and every rank's
//! waiting kernels run at once. Checked on the SIMT emulator, which imitates an H100's
//! 132 SMs (`emu-nv`) and an MI300X's 304 CUs (`emu-amd`); on a GPU the GPU check runs
//! the same worlds.

use std::time::Duration;

use tessera::prelude::*;
use tessera::{Confinement, EmuKind, Error, Part};
use tessera_tests::kernels::ping_pong;

fn emu(kind: EmuKind) -> Device {
    Device::emu(kind).expect("the emulator is always available")
}

fn small(world: World) -> World {
    world
        .heap_bytes(1 << 20)
        .signal_bytes(16 << 10)
        .wait_timeout(Duration::from_secs(20))
}

#[test]
fn ranks_sharing_a_device_get_a_part_each() {
    for kind in [EmuKind::Nv, EmuKind::Amd] {
        let seen = small(World::local(4).on(&emu(kind)))
            .run(|r| Ok((r.device().properties(), r.device().name())))
            .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        for (i, (props, name)) in seen.iter().enumerate() {
            assert_eq!(
                props.part,
                Some(Part {
                    index: i as u32,
                    parts: 4,
                    confinement: Confinement::Sized
                }),
                "{kind:?} rank {i}"
            );
            assert_eq!(props.multiprocessors, kind.multiprocessors() / 4);
            assert!(
                name.contains(&format!("part {} of 4", i + 1)) && name.contains("sized launches"),
                "{name}"
            );
        }
    }
    // One rank keeps the whole device; the CPU is never split.
    let whole = small(World::local(1).on(&emu(EmuKind::Nv)))
        .run(|r| Ok(r.device().properties()))
        .expect("runs");
    assert_eq!(whole[0].part, None);
    assert_eq!(whole[0].multiprocessors, 132);
    let cpu = small(World::local(3))
        .run(|r| Ok(r.device().properties().part))
        .expect("runs");
    assert_eq!(cpu, vec![None; 3]);
}

#[test]
fn partitions_are_checked() {
    let d = emu(EmuKind::Nv);
    for bad in [0, 133] {
        let e = d.partition(bad).expect_err("no such partition");
        assert!(e.to_string().contains("1 to 132 parts"), "{e}");
    }
    let parts = d.partition(3).expect("three parts");
    assert_eq!(parts.len(), 3);
    assert!(parts.iter().all(|p| *p == d), "parts are the device");
    let e = parts[1]
        .partition(2)
        .expect_err("a part is not split again");
    assert!(e.to_string().contains("part of a device already"), "{e}");
    assert_eq!(Device::cpu().partition(2).expect("the CPU").len(), 2);
}

/// Program `p` of every rank signals word `p` of its right neighbour, then waits for
/// its left neighbour's signal: every program of every rank must be resident.
#[kernel]
fn ring_signal(sig: &mut Symmetric<u64>, out: &mut Global<i32>, round: u64) {
    let me = rank();
    let right = (me + 1) % world_size();
    let pid = program_id(0);
    sig.signal(right, pid, round, SignalOp::Set);
    sig.wait_until(pid, CmpPred::Ge, round);
    out.store(pid, me, pid.ge(0));
}

#[test]
fn a_waiting_kernel_must_fit_in_its_ranks_share() {
    // 64 parts of emu-nv's 132 SMs: 2 SMs each, 16 programs of 4 warps per SM.
    let parts = emu(EmuKind::Nv).partition(64).expect("64 parts");
    let share = 2 * EmuKind::Nv.programs_per_multiprocessor(4);
    assert_eq!(share, 32);
    for (programs, fits) in [(share, true), (share + 1, false)] {
        let res = small(World::local(2).on_each(&parts[..2])).run(|r| {
            let mut sig = r.alloc_signals(programs as usize)?;
            let mut out = r.device().upload(&vec![-1i32; programs as usize])?;
            ring_signal::launch(r.device(), programs, (&mut sig, &mut out, 1u64))?;
            out.download()
        });
        match (res, fits) {
            (Ok(out), true) => {
                for (me, got) in out.iter().enumerate() {
                    assert_eq!(got, &vec![me as i32; programs as usize]);
                }
            }
            (Err(e), false) => {
                let s = e.to_string();
                assert!(
                    matches!(e, Error::Launch { .. })
                        && s.contains(&format!("all {programs} programs must be resident"))
                        && s.contains(&format!("at most {share}"))
                        && s.contains("part 1 of 64"),
                    "{s}"
                );
            }
            (r, _) => panic!("{programs} programs: {:?}", r.map(|_| ())),
        }
    }
}

#[test]
fn ranks_of_one_device_wait_for_each_other_inside_one_launch() {
    // Ping-pong: each serve is one rank's kernel waiting for the other's, so the
    // ranks' kernels must run at the same time on the one device.
    const B: usize = 32;
    for kind in [EmuKind::Nv, EmuKind::Amd] {
        let out = small(World::local(2).on(&emu(kind)))
            .run(|r| {
                let init: Vec<f32> = (0..B).map(|i| i as f32 * 0.5 - 3.0).collect();
                let mut data = r.upload(&if r.rank() == 0 {
                    init
                } else {
                    vec![f32::NAN; B]
                })?;
                let mut sig = r.alloc_signals(2)?;
                ping_pong::<B>::launch(r.device(), 1u32, (&mut data, &mut sig, 7))?;
                data.download()
            })
            .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        let want: Vec<f32> = (0..B).map(|i| i as f32 * 0.5 - 3.0 + 7.0).collect();
        assert_eq!(out[0], want, "{kind:?}");
    }
}
