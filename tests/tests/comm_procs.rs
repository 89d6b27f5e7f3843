//! Ranks as processes: this test binary starts copies of itself with
//! `tessera::world::spawn_local` (as `torchrun` would), each joining the world with
//! `World::launched()?.join()`. Ping-pong and `barrier_all` across processes, host
//! barriers, a rank that dies, and ranks that disagree on the configuration.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use tessera::prelude::*;
use tessera_tests::kernels::ping_pong;

const SCENARIO: &str = "TESSERA_PROCS_TEST";
const SEED: &str = "TESSERA_PROCS_SEED";
const B: usize = 64;
const ROUNDS: i32 = 8;

/// Every rank stores its tile into slot `rank` of every rank's `data`, then
/// `barrier_all`, then copies every slot of its own `data` to `out`.
#[kernel]
fn all_gather<const B: usize>(
    data: &mut Symmetric<i32>,
    mine: &Global<i32>,
    out: &mut Global<i32>,
) {
    let me = rank();
    let n = world_size();
    let offs = arange::<B>();
    let all = offs.lt(B as i32);
    let v = mine.load(offs, all);
    for p in 0..n {
        data.on(p).store(me * B + offs, v, all);
    }
    barrier_all();
    for p in 0..n {
        let slot = p * B + offs;
        out.store(slot, data.load(slot, all), all);
    }
}

fn tile_f32(seed: u64, rank: u32) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_add(u64::from(rank)));
    (0..B)
        .map(|_| rng.gen_range(-100.0f32..100.0).round() / 4.0)
        .collect()
}

fn tile_i32(seed: u64, rank: u32) -> Vec<i32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_add(1000 + u64::from(rank)));
    (0..B)
        .map(|_| rng.gen_range(-1_000_000..1_000_000))
        .collect()
}

fn world() -> World {
    World::launched()
        .expect("launch environment")
        .heap_bytes(4 << 20)
        .signal_bytes(64 << 10)
        .wait_timeout(Duration::from_secs(20))
}

fn ping_pong_rank(r: &Rank, seed: u64) -> Result<String, Error> {
    let init = tile_f32(seed, 0);
    let mut data = r.upload(&if r.rank() == 0 {
        init.clone()
    } else {
        vec![f32::NAN; B]
    })?;
    let mut sig = r.alloc_signals(2)?;
    r.barrier()?;
    ping_pong::<B>::launch(r.device(), 1u32, (&mut data, &mut sig, ROUNDS))?;
    r.barrier()?;
    let want: Vec<f32> = init.iter().map(|x| x + ROUNDS as f32).collect();
    let mine = data.download()?;
    match r.rank() {
        0 => assert_eq!(mine, want, "rank 0's tile after {ROUNDS} rounds"),
        1 => {
            // Rank 1 last received the tile of round ROUNDS (before adding one), and
            // reads rank 0's final tile through the shared mapping.
            let last: Vec<f32> = init.iter().map(|x| x + (ROUNDS - 1) as f32).collect();
            assert_eq!(mine, last, "rank 1's tile");
            assert_eq!(
                data.download_peer(0)?,
                want,
                "rank 0's tile seen from rank 1"
            );
        }
        _ => assert!(
            mine.iter().all(|v| v.is_nan()),
            "an idle rank's tile was written"
        ),
    }
    let s = sig.download()?;
    let want_sig = match r.rank() {
        // put_signal(peer, .., sig, idx, ..) sets word `idx` on the peer.
        0 => vec![0, ROUNDS as u64],
        1 => vec![ROUNDS as u64, 0],
        _ => vec![0, 0],
    };
    assert_eq!(s, want_sig, "signals of rank {}", r.rank());
    Ok(format!("ping-pong ok on rank {}", r.rank()))
}

fn all_gather_rank(r: &Rank, seed: u64) -> Result<String, Error> {
    let n = r.size();
    let mut data = r.upload(&vec![i32::MIN; B * n as usize])?;
    let mine = r.device().upload(&tile_i32(seed, r.rank()))?;
    let mut out = r.device().upload(&vec![-7i32; B * n as usize])?;
    // Host barriers between launches: every rank arrives the same number of times.
    for round in 0..3 {
        r.barrier()?;
        all_gather::<B>::launch(r.device(), 1u32, (&mut data, &mine, &mut out))?;
        let got = out.download()?;
        let want: Vec<i32> = (0..n).flat_map(|p| tile_i32(seed, p)).collect();
        assert_eq!(got, want, "rank {} round {round}", r.rank());
        out.fill(-7)?;
    }
    r.barrier()?;
    Ok(format!("all-gather ok on rank {} of {n}", r.rank()))
}

/// Rank 1 exits after the allocations; the others must fail quickly, naming it:
/// rank 0 waits for it inside a kernel (`wait_until`), rank 2 in `barrier_all`,
/// rank 3 at a host barrier.
fn dies_rank(r: &Rank, seed: u64) -> Result<String, Error> {
    // Allocations are synchronizing: every rank makes them, then rank 1 dies.
    let mut data = r.upload(&tile_f32(seed, 0))?;
    let mut sig = r.alloc_signals(2)?;
    let mut gathered = r.alloc::<i32>(B * r.size() as usize)?;
    if r.rank() == 1 {
        std::process::exit(3);
    }
    let start = Instant::now();
    let outcome = match r.rank() {
        0 => ping_pong::<B>::launch(r.device(), 1u32, (&mut data, &mut sig, ROUNDS)),
        2 => {
            let mine = r.device().upload(&tile_i32(seed, 2))?;
            let mut out = r.device().alloc::<i32>(B * r.size() as usize)?;
            all_gather::<B>::launch(r.device(), 1u32, (&mut gathered, &mine, &mut out))
        }
        _ => r.barrier(),
    };
    let e = outcome.expect_err("a rank waiting for a dead rank must fail");
    let secs = start.elapsed().as_secs_f64();
    Ok(format!("failed after {secs:.3} s: {e}"))
}

/// Rank 1 stops (`SIGSTOP`) after joining; rank 0 waits for it at a host barrier and
/// must fail within the wait timeout, naming it, and exit (not wait forever for the
/// stopped process to leave).
fn stops_rank(r: &Rank) -> Result<String, Error> {
    if r.rank() == 1 {
        // SAFETY: raising a signal has no preconditions; SIGSTOP stops this process
        // before `raise` returns (until the test kills it).
        assert_eq!(unsafe { libc::raise(libc::SIGSTOP) }, 0);
    }
    r.barrier()?;
    Ok("passed the barrier".into())
}

/// Rank 1 leaves right after joining; the others' next host barrier must fail at
/// once, naming it.
fn leaves_rank(r: &Rank) -> Result<String, Error> {
    if r.rank() == 1 {
        return Ok("left".into());
    }
    let start = Instant::now();
    let e = r
        .barrier()
        .expect_err("a barrier without a rank that left must fail");
    Ok(format!(
        "failed after {:.3} s: {e}",
        start.elapsed().as_secs_f64()
    ))
}

/// Rank 0 leaves at once; rank 1 keeps working past rank 0's patience (the 1 s wait
/// timeout), then checks that the world did not fail: rank 0 left, it did not die.
fn late_rank(r: &Rank) -> Result<String, Error> {
    if r.rank() == 1 {
        std::thread::sleep(Duration::from_millis(2500));
    }
    Ok(format!("failed rank {:?}", r.failed_rank()))
}

/// The body run by each child process (a no-op when run directly).
#[test]
fn child_rank_body() {
    let Ok(scenario) = std::env::var(SCENARIO) else {
        return;
    };
    // A rank process logs like an application: Tessera's warnings to stderr.
    let _ = env_logger::Builder::from_env(env_logger::Env::new().filter_or("TESSERA_LOG", "warn"))
        .try_init();
    let seed: u64 = std::env::var(SEED)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let w = if scenario == "mismatch" {
        // Rank 1 asks for a bigger heap than the others.
        let env_rank: u32 = std::env::var("RANK").unwrap().parse().unwrap();
        world().heap_bytes(if env_rank == 1 { 8 << 20 } else { 4 << 20 })
    } else if scenario == "stops" {
        world().wait_timeout(Duration::from_secs(3))
    } else if scenario == "late" {
        world().wait_timeout(Duration::from_secs(1))
    } else {
        world()
    };
    let result = w.run_process(|r| match scenario.as_str() {
        "ping_pong" => ping_pong_rank(r, seed),
        "all_gather" => all_gather_rank(r, seed),
        "dies" => dies_rank(r, seed),
        "mismatch" => Ok("joined".into()),
        "stops" => stops_rank(r),
        "leaves" => leaves_rank(r),
        "late" => late_rank(r),
        other => panic!("unknown scenario {other}"),
    });
    match result {
        Ok(msg) => println!("RESULT {msg}"),
        Err(e) => {
            println!("ERROR {e}");
            std::process::exit(1);
        }
    }
}

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// This test binary, running only `child_rank_body` as a rank of `scenario`.
fn rank_command(scenario: &str) -> std::process::Command {
    let exe = std::env::current_exe().expect("test binary path");
    let mut c = std::process::Command::new(exe);
    c.args([
        "--exact",
        "child_rank_body",
        "--test-threads",
        "1",
        "--nocapture",
    ])
    .env(SCENARIO, scenario);
    c
}

fn spawn(n: usize, scenario: &str) -> Vec<Ran> {
    let seed: u64 = rand::thread_rng().r#gen();
    let outputs = tessera::world::spawn_local_with(n, |_| {
        let mut c = rank_command(scenario);
        c.env(SEED, seed.to_string());
        c
    })
    .expect("spawn ranks");
    outputs
        .into_iter()
        .map(|o| Ran {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        })
        .collect()
}

fn dump(runs: &[Ran]) -> String {
    runs.iter()
        .enumerate()
        .map(|(r, x)| format!("--- rank {r} (exit {:?})\n{}{}", x.code, x.stdout, x.stderr))
        .collect()
}

/// Rank `r` printed `RESULT failed after <secs> s: <error>` with `cause` in the error,
/// well before the 20 s wait timeout.
fn failed_quickly(runs: &[Ran], r: usize, cause: &str) {
    let line = runs[r]
        .stdout
        .lines()
        .find_map(|l| l.split_once("RESULT failed after ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("rank {r} did not fail as expected\n{}", dump(runs)));
    assert!(line.contains(cause), "rank {r}: {line}");
    let secs: f64 = line
        .split(' ')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::MAX);
    assert!(secs < 10.0, "rank {r} took {secs} s (timeout 20 s): {line}");
}

#[test]
fn ping_pong_across_two_processes() {
    let runs = spawn(2, "ping_pong");
    for (r, x) in runs.iter().enumerate() {
        assert!(
            x.code == Some(0)
                && x.stdout
                    .contains(&format!("RESULT ping-pong ok on rank {r}")),
            "{}",
            dump(&runs)
        );
    }
}

#[test]
fn barrier_all_across_four_processes() {
    let runs = spawn(4, "all_gather");
    for (r, x) in runs.iter().enumerate() {
        assert!(
            x.code == Some(0)
                && x.stdout
                    .contains(&format!("RESULT all-gather ok on rank {r} of 4")),
            "{}",
            dump(&runs)
        );
    }
}

#[test]
fn a_dead_process_fails_the_others_quickly() {
    let start = Instant::now();
    let runs = spawn(4, "dies");
    assert_eq!(runs[1].code, Some(3), "{}", dump(&runs));
    for r in [0, 2, 3] {
        failed_quickly(&runs, r, "rank 1");
    }
    // The host-barrier waiter reports the death itself.
    assert!(
        runs[3]
            .stdout
            .contains("rank 1's process exited without leaving the world"),
        "{}",
        dump(&runs)
    );
    assert!(start.elapsed() < Duration::from_secs(60));
}

#[test]
fn a_rank_that_leaves_early_fails_the_others_barriers_at_once() {
    let runs = spawn(3, "leaves");
    assert!(
        runs[1].code == Some(0) && runs[1].stdout.contains("RESULT left"),
        "{}",
        dump(&runs)
    );
    for r in [0, 2] {
        failed_quickly(&runs, r, "rank 1 left the world");
    }
}

#[test]
fn rank_0_leaving_before_a_busy_rank_is_no_failure() {
    let runs = spawn(2, "late");
    for x in &runs {
        assert!(
            x.code == Some(0) && x.stdout.contains("RESULT failed rank None"),
            "{}",
            dump(&runs)
        );
    }
    // Rank 0 said who was still in the world when its patience ran out.
    assert!(
        runs[0]
            .stderr
            .contains("rank(s) 1 did not leave within 1.000 s"),
        "{}",
        dump(&runs)
    );
}

/// A stopped (`SIGSTOP`) rank of three: ranks 0 and 2 fail within their 3 s wait
/// timeout, each naming the root cause (rank 1), not the other rank that gave up
/// first, and exit, although rank 1's process lives on.
#[test]
fn a_stopped_rank_fails_the_others_in_bounded_time_naming_it() {
    let sock = std::env::temp_dir().join(format!("tessera-stop-test-{}.sock", std::process::id()));
    let mut children: Vec<_> = (0..3)
        .map(|r| {
            rank_command("stops")
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "3")
                .env("TESSERA_BOOTSTRAP", &sock)
                .env("TESSERA_BOOTSTRAP_SECRET", "stop-test")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn rank")
        })
        .collect();
    let start = Instant::now();
    let exited = loop {
        let done = [0usize, 2]
            .iter()
            .all(|&r| matches!(children[r].try_wait(), Ok(Some(_))));
        if done {
            break true;
        }
        if start.elapsed() > Duration::from_secs(60) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let secs = start.elapsed().as_secs_f64();
    for c in children.iter_mut() {
        let _ = c.kill();
    }
    let mut outs = Vec::new();
    for (r, c) in children.into_iter().enumerate() {
        let o = c.wait_with_output().expect("rank output");
        if r != 1 {
            outs.push((r, o));
        }
    }
    for (r, o) in outs {
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            exited,
            "rank {r} still runs after {secs:.1} s\n{stdout}{stderr}"
        );
        assert_eq!(o.status.code(), Some(1), "rank {r}: {stdout}{stderr}");
        assert!(
            stdout.contains("ERROR")
                && (stdout.contains("rank 1 never arrived")
                    || stdout.contains("rank 1 stopped answering")),
            "rank {r}: {stdout}{stderr}"
        );
        for other in [0, 2] {
            assert!(
                !stdout.contains(&format!("rank {other} failed")),
                "rank {r} blames rank {other}: {stdout}{stderr}"
            );
        }
    }
}

#[test]
fn ranks_with_different_configurations_are_refused() {
    let runs = spawn(2, "mismatch");
    for x in &runs {
        assert_eq!(x.code, Some(1), "{}", dump(&runs));
        assert!(
            x.stdout.contains("another configuration"),
            "{}",
            dump(&runs)
        );
    }
}

/// The variables `torchrun` sets (no `TESSERA_BOOTSTRAP`): the socket is derived from
/// `MASTER_ADDR`/`MASTER_PORT`/`TORCHELASTIC_RUN_ID`.
#[test]
fn torchrun_environment() {
    let port: u16 = rand::thread_rng().gen_range(20000..60000);
    let run_id = format!("test-{}", std::process::id());
    let children: Vec<_> = (0..2)
        .map(|r| {
            rank_command("ping_pong")
                .env(SEED, "42")
                .env("RANK", r.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("TORCHELASTIC_RUN_ID", &run_id)
                .env_remove("TESSERA_BOOTSTRAP")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn rank")
        })
        .collect();
    let runs: Vec<Ran> = children
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().expect("rank output");
            Ran {
                code: o.status.code(),
                stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            }
        })
        .collect();
    for (r, x) in runs.iter().enumerate() {
        assert!(
            x.code == Some(0)
                && x.stdout
                    .contains(&format!("RESULT ping-pong ok on rank {r}")),
            "{}",
            dump(&runs)
        );
    }
}
