//! The lab a benchmark runs in (`--lab`: a spec file or a built-in lab,
//! `vmscope_lab::builtin`): a lab that is already up is reused and left up;
//! one this run brought up is torn down at the end, also when the run
//! fails.

use crate::BenchError;
use vmscope_lab::{lab, LabOptions, LabSpec, LabState};

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
