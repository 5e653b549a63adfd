//! The tenants demo (`examples/tenants/`), run as a process in its quick
//! mode: one noisy tenant and five quiet ones on a real axum server, behind
//! a keyed bulkhead with a ceiling, one shared bulkhead, and a bulkhead per
//! tenant without a ceiling. By hand:
//!
//! ```text
//! cargo test --features axum --test tenants_demo
//! ```
//!
//! Only what holds on a loaded two-core machine in a debug build is
//! asserted: who gets served, and how many calls are inside the dependency
//! at once. No latency is: the demo prints those, and `docs/tenants.md`
//! shows them from release builds.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

/// The example's binary, beside this test's, built (or found fresh) by the
/// same cargo with this test's profile, target directory and features:
/// `cargo test --test tenants_demo` alone does not build examples, and
/// `--examples` builds them as tests.
fn example() -> PathBuf {
    let mut profile_dir = std::env::current_exe().unwrap();
    profile_dir.pop(); // this test's binary
    profile_dir.pop(); // deps/
    let features: Vec<&str> = [
        ("axum", cfg!(feature = "axum")),
        ("http", cfg!(feature = "http")),
        ("metrics", cfg!(feature = "metrics")),
        ("tracing", cfg!(feature = "tracing")),
        ("serde", cfg!(feature = "serde")),
        ("redis", cfg!(feature = "redis")),
    ]
    .into_iter()
    .filter_map(|(feature, on)| on.then_some(feature))
    .collect();
    let mut build = Command::new(env!("CARGO"));
    build
        .args(["build", "--example", "tenants", "--features"])
        .arg(features.join(","))
        .arg("--target-dir")
        .arg(profile_dir.parent().unwrap())
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        build.arg("--release");
    }
    let status = build.status().unwrap();
    assert!(status.success(), "building the example failed: {status}");
    let path = profile_dir
        .join("examples")
        .join(format!("tenants{}", std::env::consts::EXE_SUFFIX));
    assert!(path.exists(), "{} is missing", path.display());
    path
}

/// The `RESULT variant=NAME key=value ...` lines, by variant.
fn results(stdout: &str) -> HashMap<String, HashMap<String, f64>> {
    stdout
        .lines()
        .filter_map(|line| line.strip_prefix("RESULT "))
        .map(|line| {
            let mut variant = String::new();
            let mut fields = HashMap::new();
            for pair in line.split_whitespace() {
                let (name, value) = pair.split_once('=').unwrap();
                if name == "variant" {
                    variant = value.to_owned();
                } else {
                    fields.insert(name.to_owned(), value.parse().unwrap());
                }
            }
            (variant, fields)
        })
        .collect()
}

#[test]
fn a_keyed_bulkhead_with_a_ceiling_serves_the_quiet_tenants_and_holds_the_dependency_to_c() {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tenants_demo");
    let output = Command::new(example())
        // A smaller dependency than the demo's own (96 calls at once): a
        // quarter of the requests, for a debug build on a loaded machine.
        .args(["--quick", "--capacity", "24", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results = results(&stdout);
    let get = |variant: &str, field: &str| -> f64 {
        *results
            .get(variant)
            .and_then(|fields| fields.get(field))
            .unwrap_or_else(|| panic!("no {field} for {variant} in:\n{stdout}"))
    };
    let c = get("keyed", "c");

    // Keyed, with a ceiling: the quiet tenants are served, and the
    // dependency never holds more than C calls, whatever the noisy one sends.
    assert!(get("keyed", "quiet_success") >= 99.0, "{stdout}");
    assert!(get("keyed", "peak_inside") <= c, "{stdout}");
    // One shared bulkhead: the quiet tenants are shed with the noisy one.
    assert!(
        get("shared", "quiet_success") < get("keyed", "quiet_success"),
        "{stdout}"
    );
    // A bulkhead per tenant and no ceiling: more than C inside at once.
    assert!(get("per_tenant_no_ceiling", "peak_inside") > c, "{stdout}");

    assert!(out.join("quick-tenants.csv").exists());
    assert!(out.join("quick-tenants.svg").exists());
}
