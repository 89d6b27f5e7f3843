//! `tessera::config`: the README's table is the configuration's, a bad variable is an
//! error naming it wherever it is needed, and `config::set` takes effect.

use std::process::Command;

use tessera::config::{self, VARIABLES};
use tessera::prelude::*;

#[kernel]
fn plus_one<const B: usize>(x: &Global<f32>, out: &mut Global<f32>) {
    let offs = arange::<B>();
    out.store_unmasked(offs, x.load_unmasked(offs) + 1.0);
}

/// The README's configuration table lists exactly `config::VARIABLES`, in order,
/// with the same words.
#[test]
fn the_readme_table_is_the_configuration() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let rows: Vec<&str> = readme
        .lines()
        .skip_while(|l| *l != "| variable | accepts | what it does |")
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    let want: Vec<String> = VARIABLES
        .iter()
        .map(|v| format!("| `{}` | {} | {} |", v.name, v.accepts, v.meaning))
        .collect();
    assert_eq!(
        rows, want,
        "update the README's table from tessera::config::VARIABLES"
    );
    // No other table or paragraph names a variable the configuration does not know.
    for word in readme.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("TESSERA_") && word.len() > "TESSERA_".len() {
            assert!(
                VARIABLES.iter().any(|v| v.name == word) || word == "TESSERA_SEED",
                "the README names {word}, which tessera::config does not know"
            );
        }
    }
}

const CHILD: &str = "TESSERA_CONFIG_TEST_CHILD";

/// Runs test `name` of this binary alone in a child process with `vars` set.
fn child(name: &str, vars: &[(&str, &str)]) {
    let exe = std::env::current_exe().expect("the test binary");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", name, "--test-threads=1"])
        .env(CHILD, "1");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the child runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
}

/// A bad variable is an error from every entry point that needs the configuration,
/// naming the variable; it is never replaced by a default.
#[test]
fn a_bad_variable_fails_where_it_is_needed() {
    if std::env::var_os(CHILD).is_none() {
        return child(
            "a_bad_variable_fails_where_it_is_needed",
            &[("TESSERA_HEAP_BYTES", "lots")],
        );
    }
    let says = |e: &Error| {
        let s = e.to_string();
        assert!(matches!(e, Error::Config(_)), "{s}");
        assert!(
            s.contains("TESSERA_HEAP_BYTES=`lots`") && s.contains("a positive number of bytes"),
            "{s}"
        );
    };
    says(&config::get().unwrap_err());
    says(&Device::best().unwrap_err());
    says(&World::local(2).run(|_| Ok(())).unwrap_err());
    let dev = Device::cpu();
    let x = dev.upload(&[1.0f32; 4]).unwrap();
    let mut out = dev.alloc::<f32>(4).unwrap();
    says(&plus_one::<4>::launch(&dev, 1u32, (&x, &mut out)).unwrap_err());
    // Set in code, the configuration is whole again.
    config::set(config::Config::default());
    plus_one::<4>::launch(&dev, 1u32, (&x, &mut out)).unwrap();
    assert_eq!(out.download().unwrap(), vec![2.0; 4]);
}

/// Values are read once, typed, and used: `TESSERA_DEVICE` picks the device, and
/// `config::set` replaces what the environment said.
#[test]
fn values_are_used_and_set_replaces_them() {
    if std::env::var_os(CHILD).is_none() {
        return child(
            "values_are_used_and_set_replaces_them",
            &[
                ("TESSERA_DEVICE", "emu-amd"),
                ("TESSERA_WAIT_TIMEOUT", "1.5s"),
                ("TESSERA_HEAP_BYTES", "8M"),
            ],
        );
    }
    let c = config::get().unwrap();
    assert_eq!(c.wait_timeout, std::time::Duration::from_millis(1500));
    assert_eq!(c.heap_bytes, 8 << 20);
    assert_eq!(Device::best().unwrap().id(), "emu-amd");
    let r = World::local(1).run(|r| Ok(r.wait_timeout())).unwrap();
    assert_eq!(r, vec![std::time::Duration::from_millis(1500)]);
    // Dumps go where the configuration set in code says.
    let dir = tempfile::tempdir().unwrap();
    let mut c = (*config::get().unwrap()).clone();
    c.device = Some("cpu".into());
    c.dump = config::DumpStages::new(&["ir"]).unwrap();
    c.dump_dir = dir.path().to_path_buf();
    config::set(c);
    let dev = Device::best().unwrap();
    assert_eq!(dev.id(), "cpu");
    let x = dev.upload(&[1.0f32; 8]).unwrap();
    let mut out = dev.alloc::<f32>(8).unwrap();
    plus_one::<8>::launch(&dev, 1u32, (&x, &mut out)).unwrap();
    let dumped: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        dumped
            .iter()
            .any(|n| n.starts_with("plus_one-") && n.ends_with(".ir")),
        "{dumped:?}"
    );
}
