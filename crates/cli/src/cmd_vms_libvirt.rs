//! The LIBVIRT column of `vmscope vms`: each VM's libvirt domain name,
//! UUID and state, shown when libvirt answered for at least one VM.

use comfy_table::{Cell, Table};
use vmscope_discover::Vm;
use vmscope_model::text::{visible, visible_cut, NAME_WIDTH};

/// Add the column's header to a table whose header is already set.
pub fn add_header(t: &mut Table) {
    let mut cells: Vec<Cell> = t
        .header()
        .map(|h| h.cell_iter().cloned().collect())
        .unwrap_or_default();
    cells.push(Cell::new("LIBVIRT (domain, uuid, state)"));
    t.set_header(cells);
}

/// `name\nuuid\nstate`, or `-` for a VM libvirt does not know.
pub fn cell(vm: &Vm) -> String {
    match &vm.libvirt {
        Some(d) => format!(
            "{}\n{}\n{}",
            visible_cut(&d.name, NAME_WIDTH),
            visible(&d.uuid),
            visible(&d.state)
        ),
        None => "-".into(),
    }
}
