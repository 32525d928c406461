//! `stat -o` and `account -o` keep their intervals in a session file that
//! `report` summarizes, on the live host.

mod common;

use common::{report_json, run_ok, vmscope};

#[test]
fn stat_and_account_keep_their_intervals_for_report() {
    let dir = tempfile::tempdir().unwrap();
    for (cmd, kind) in [("stat", "stat"), ("account", "account")] {
        let db = dir.path().join(format!("{kind}.db"));
        let t0 = std::time::Instant::now();
        let out = run_ok(
            vmscope()
                .args([cmd, "-i", "200ms", "-n", "3", "--format", "csv", "-o"])
                .arg(&db),
        );
        let ran = t0.elapsed().as_secs_f64();
        assert!(!out.stdout.is_empty(), "{cmd} printed nothing");
        let v = report_json(&db, &[]);
        assert_eq!(v["meta"]["source"], kind);
        let iv = &v["intervals"][0];
        assert_eq!(iv["kind"], kind);
        assert_eq!(iv["intervals"], 3, "{iv}");
        let secs = iv["seconds"].as_f64().unwrap();
        // Three intervals of at least 200 ms each, all inside the command's
        // run (an invariant, not a timing: load only lengthens both).
        assert!(
            secs >= 0.6 * 0.95 && secs <= ran,
            "{secs} s for 3 x 200 ms in a run of {ran:.2} s"
        );
        let text = String::from_utf8(run_ok(vmscope().arg("report").arg(&db)).stdout).unwrap();
        assert!(text.contains(&format!("# {kind:<9} 3 intervals")), "{text}");
        if kind == "stat" {
            // Every CPU's busy share, a percentage.
            let busy: Vec<f64> = iv["rates"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["metric"] == "busy")
                .map(|r| r["per_second"].as_f64().unwrap())
                .collect();
            assert!(!busy.is_empty());
            // A share of each interval's length, summed and divided again:
            // 1 + 2e-16 is a CPU busy throughout, not a fault.
            assert!(
                busy.iter().all(|b| (0.0..=1.0 + 1e-9).contains(b)),
                "{busy:?}"
            );
        } else {
            assert!(text.contains("# host      measured "), "{text}");
        }
        // The HTML page of a session of intervals: its header and charts,
        // nothing about samples it does not have.
        let html = dir.path().join(format!("{kind}.html"));
        run_ok(
            vmscope()
                .arg("report")
                .arg(&db)
                .args(["--format", "html", "-o"])
                .arg(&html),
        );
        let page = std::fs::read_to_string(&html).unwrap();
        assert!(page.contains("This session holds intervals"), "{kind}");
        for absent in [
            "Domains (",
            "Top functions",
            "Flame graphs",
            "recorded without -g",
            "No per-second counts",
        ] {
            assert!(!page.contains(absent), "{kind}: the page says '{absent}'");
        }
        // vm-stat charts every domain, the host included; account charts
        // VMs only, and this host may run none.
        if kind == "stat" {
            assert!(page.contains("<polyline"), "{kind}: no chart");
        }
    }
}
