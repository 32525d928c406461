//! The labs `bench io --lab` brings up: a spec file, or the built-in
//! `storage-quad` (giacobbi2011's machines: one VM on a raw file image, a
//! qcow2 image, a raw block device and an LVM volume, all `cache=none`).
//! A lab that is already up is reused and left up; one this run brought
//! up is torn down at the end, also when the run fails.

use crate::BenchError;
use std::path::Path;
use vmscope_lab::{lab, LabOptions, LabSpec, LabState};

/// Built-in specs, by name.
pub const BUILT_IN: [(&str, &str); 1] = [(
    "storage-quad",
    include_str!("../../../../labs/storage-quad.toml"),
)];

/// The spec named by `--lab`: a file, or a built-in name.
pub fn load_spec(arg: &str, name: Option<&str>) -> Result<LabSpec, BenchError> {
    let mut spec = if Path::new(arg).is_file() {
        LabSpec::from_file(Path::new(arg))?
    } else if let Some((n, text)) = BUILT_IN.iter().find(|(n, _)| *n == arg) {
        LabSpec::parse(text, Path::new(&format!("(built-in) labs/{n}.toml")))?
    } else {
        return Err(BenchError::bad(format!(
            "--lab {arg}: no such spec file, and not a built-in lab ({})",
            BUILT_IN.map(|(n, _)| n).join(", ")
        )));
    };
    if let Some(n) = name {
        if !vmscope_lab::names::valid_name(n) {
            return Err(BenchError::bad(format!(
                "--lab-name {n}: lab names are letters, digits, '-' and '_', start with a letter or digit, at most 32 characters"
            )));
        }
        spec.name = n.to_string();
    }
    Ok(spec)
}

/// A lab in use by a run.
pub struct LabSession {
    pub state: LabState,
    /// This run brought it up (and takes it down unless kept).
    pub owned: bool,
    keep: bool,
    opts: LabOptions,
    closed: bool,
}

impl LabSession {
    /// Reuses the lab if it is up (a VM of it runs), else brings it up.
    pub fn open(spec: &LabSpec, opts: &LabOptions, keep: bool) -> Result<LabSession, BenchError> {
        if let Ok(st) = lab::load_state_in(&opts.run_root, &spec.name) {
            if st.vms.iter().any(lab::vm_running) {
                return Ok(LabSession {
                    state: st,
                    owned: false,
                    keep: true,
                    opts: opts.clone(),
                    closed: false,
                });
            }
        }
        let state = lab::up(spec, opts)?;
        Ok(LabSession {
            state,
            owned: true,
            keep,
            opts: opts.clone(),
            closed: false,
        })
    }

    /// [`LabSession::open`], saying on `progress` what it is doing and
    /// whether the lab was brought up or reused (the network and scaling
    /// benchmarks).
    pub fn open_shown(
        spec: &LabSpec,
        opts: &LabOptions,
        keep: bool,
        progress: &crate::progress::Progress,
    ) -> Result<LabSession, BenchError> {
        progress.set_message(format!("lab {}: starting (or reusing) its VMs", spec.name));
        let s = LabSession::open(spec, opts, keep)?;
        progress.note(&format!(
            "lab {}: {} (accel {})",
            s.state.name,
            if s.owned {
                "brought up"
            } else {
                "already up, reused"
            },
            s.state.accel
        ));
        Ok(s)
    }

    /// Runs `body` in the lab of `spec` (none: no lab), opened with
    /// [`LabSession::open_shown`] before and closed after, whatever `body`
    /// returned; `progress` is finished before the lab closes.
    pub fn run_within<T>(
        spec: Option<&LabSpec>,
        opts: &LabOptions,
        keep: bool,
        progress: &crate::progress::Progress,
        body: impl FnOnce(Option<&LabState>) -> Result<T, BenchError>,
    ) -> Result<T, BenchError> {
        let session = spec
            .map(|spec| LabSession::open_shown(spec, opts, keep, progress))
            .transpose()?;
        let r = body(session.as_ref().map(|s| &s.state));
        progress.finish();
        if let Some(s) = session {
            s.close()?;
        }
        r
    }

    /// Tears the lab down if this run brought it up and it is not kept.
    pub fn close(mut self) -> Result<(), BenchError> {
        self.closed = true;
        if self.owned && !self.keep {
            lab::down(&self.state.name, &self.opts)?;
        }
        Ok(())
    }
}

impl Drop for LabSession {
    fn drop(&mut self) {
        if !self.closed && self.owned && !self.keep {
            let _ = lab::down(&self.state.name, &self.opts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_storage_quad_parses_with_four_backends() {
        let s = load_spec("storage-quad", None).unwrap();
        assert_eq!(s.name, "storage-quad");
        let disks = &s.vms[0].disks;
        let kinds: Vec<String> = disks
            .iter()
            .map(|d| format!("{:?}-{}", d.backend, d.format.as_str()))
            .collect();
        assert_eq!(kinds, ["File-raw", "File-qcow2", "Block-raw", "Lvm-raw"]);
        assert!(disks.iter().all(|d| d.cache == "none"));
        assert!(disks.last().unwrap().optional);
        let s = load_spec("storage-quad", Some("benchio-x")).unwrap();
        assert_eq!(s.name, "benchio-x");
        let e = load_spec("no-such-lab", None).unwrap_err().to_string();
        assert!(
            e.contains("no-such-lab") && e.contains("storage-quad"),
            "{e}"
        );
        assert!(load_spec("storage-quad", Some("bad name")).is_err());
    }
}
