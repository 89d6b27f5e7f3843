//! Autotuning on the CPU with a fake timer: the winner is the configuration the timer
//! says is fastest, it is launched, remembered in memory, persisted in the disk cache
//! (another process finds it there without timing), and `TESSERA_AUTOTUNE=off` takes
//! the first configuration. (Its own binary: it sets the process's configuration.)

use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use tessera::autotune::{Choice, Tuner};
use tessera::config::{self, CacheDir};
use tessera::prelude::*;

#[kernel]
fn fill_scaled<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, a: f32, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    out.store(offs, x.load(offs, m) * a, m);
}

#[derive(Clone, Debug, PartialEq)]
struct Cfg {
    block: usize,
    warps: u32,
    /// What the fake timer answers for it, in µs.
    fake_us: u64,
}

fn configs() -> Vec<Cfg> {
    vec![
        Cfg {
            block: 64,
            warps: 4,
            fake_us: 900,
        },
        Cfg {
            block: 128,
            warps: 2,
            fake_us: 700,
        },
        Cfg {
            block: 256,
            warps: 8,
            fake_us: 200,
        },
        Cfg {
            block: 128,
            warps: 8,
            fake_us: 500,
        },
    ]
}

/// Launches configuration `c`, recording which ran.
fn launcher<'a>(
    dev: &'a Device,
    x: &'a Buffer<f32>,
    out: &'a mut Buffer<f32>,
    ran: &'a Mutex<Vec<usize>>,
) -> impl FnMut(&Cfg) -> Result<(), Error> + 'a {
    let n = x.len();
    move |c: &Cfg| {
        ran.lock().unwrap().push(c.block * 100 + c.warps as usize);
        let opts = LaunchOptions::new().num_warps(c.warps);
        let a = c.block as f32;
        match c.block {
            64 => fill_scaled::<64>::launch_with(
                dev,
                n.div_ceil(64),
                &opts,
                (x, &mut *out, a, n as i32),
            ),
            128 => fill_scaled::<128>::launch_with(
                dev,
                n.div_ceil(128),
                &opts,
                (x, &mut *out, a, n as i32),
            ),
            _ => fill_scaled::<256>::launch_with(
                dev,
                n.div_ceil(256),
                &opts,
                (x, &mut *out, a, n as i32),
            ),
        }
    }
}

fn fake_timer(
    _: &Device,
    c: &Cfg,
    run: &mut dyn FnMut() -> Result<(), Error>,
) -> Result<Duration, Error> {
    run()?;
    Ok(Duration::from_micros(c.fake_us))
}

const CHILD: &str = "TESSERA_AUTOTUNE_TEST_CACHE";

#[test]
fn the_fastest_configuration_wins_and_is_kept() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let mut c = config::Config::default();
    c.cache_dir = CacheDir::At(cache.path().to_path_buf());
    config::set(c.clone());
    let dev = Device::cpu();
    let n = 1000;
    let x = dev.upload(&vec![1.5f32; n]).unwrap();
    let mut out = dev.upload(&vec![f32::NAN; n]).unwrap();
    let ran = Mutex::new(Vec::new());
    let tuner = Tuner::new("fill_scaled", configs()).with_timer(fake_timer);
    let (best, how) = tuner
        .run_explained(&dev, "n=1000", launcher(&dev, &x, &mut out, &ran))
        .unwrap();
    assert_eq!(best, configs()[2], "the fake timer's fastest");
    let want: Vec<Duration> = configs()
        .iter()
        .map(|c| Duration::from_micros(c.fake_us))
        .collect();
    assert_eq!(how, Choice::Timed(want));
    // Each configuration ran once under the timer, then the winner.
    assert_eq!(*ran.lock().unwrap(), vec![6404, 12802, 25608, 12808, 25608]);
    assert!(out.download().unwrap().iter().all(|&v| v == 1.5 * 256.0));

    // Again in this process: from memory, nothing timed.
    ran.lock().unwrap().clear();
    let strict = Tuner::new("fill_scaled", configs())
        .with_timer(|_, c: &Cfg, _| panic!("timed {c:?} again"));
    let (best, how) = strict
        .run_explained(&dev, "n=1000", launcher(&dev, &x, &mut out, &ran))
        .unwrap();
    assert_eq!((best, how), (configs()[2].clone(), Choice::Memory));
    assert_eq!(*ran.lock().unwrap(), vec![25608]);

    // Another process (same cache folder): from disk, nothing timed.
    let exe = std::env::current_exe().unwrap();
    let child = Command::new(exe)
        .args([
            "--exact",
            "child_reads_the_winner_from_disk",
            "--test-threads=1",
        ])
        .env(CHILD, cache.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&child.stdout).into_owned()
        + &String::from_utf8_lossy(&child.stderr);
    assert!(
        child.status.success() && text.contains("1 passed"),
        "{text}"
    );

    // Another shape is tuned on its own.
    let (_, how) = tuner
        .run_explained(&dev, "n=2000", launcher(&dev, &x, &mut out, &ran))
        .unwrap();
    assert!(matches!(how, Choice::Timed(_)), "{how:?}");

    // Tuning off: the first configuration, untimed.
    let mut off = c.clone();
    off.autotune = false;
    config::set(off);
    ran.lock().unwrap().clear();
    let (best, how) = strict
        .run_explained(&dev, "n=3000", launcher(&dev, &x, &mut out, &ran))
        .unwrap();
    assert_eq!((best, how), (configs()[0].clone(), Choice::Off));
    assert_eq!(*ran.lock().unwrap(), vec![6404]);
    assert!(out.download().unwrap().iter().all(|&v| v == 1.5 * 64.0));
    config::set(c);

    // No configurations: an error, not a panic.
    let empty: Tuner<Cfg> = Tuner::new("fill_scaled", vec![]);
    let e = empty.run(&dev, "n=1000", |_| Ok(())).unwrap_err();
    assert!(e.to_string().contains("no configurations"), "{e}");
}

#[test]
fn child_reads_the_winner_from_disk() {
    let Some(dir) = std::env::var_os(CHILD) else {
        return;
    };
    let mut c = config::Config::default();
    c.cache_dir = CacheDir::At(dir.into());
    config::set(c);
    let dev = Device::cpu();
    let x = dev.upload(&vec![1.5f32; 1000]).unwrap();
    let mut out = dev.alloc::<f32>(1000).unwrap();
    let ran = Mutex::new(Vec::new());
    let strict = Tuner::new("fill_scaled", configs())
        .with_timer(|_, c: &Cfg, _| panic!("timed {c:?} although the disk knows"));
    let (best, how) = strict
        .run_explained(&dev, "n=1000", launcher(&dev, &x, &mut out, &ran))
        .unwrap();
    assert_eq!((best, how), (configs()[2].clone(), Choice::Disk));
    // A changed configuration list does not reuse the entry: it is tuned anew.
    let mut changed = configs();
    changed[0].fake_us = 100;
    let (best, how) = Tuner::new("fill_scaled", changed.clone())
        .with_timer(fake_timer)
        .run_explained(&dev, "n=1000", launcher(&dev, &x, &mut out, &ran))
        .unwrap();
    assert_eq!(best, changed[0]);
    assert!(matches!(how, Choice::Timed(_)), "{how:?}");
}
