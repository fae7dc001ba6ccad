//! `weightbay._native`, the extension module under the `weightbay` Python package
//! (`py_src/weightbay`): containers (`containers`), the checkpoints of a run (`checkpoints`)
//! and those several ranks wrote, read by region (`assembled`), tensors exchanged through
//! DLPack (`dlpack`) and errors raised as Python exceptions (`errors`). Every call that
//! touches storage releases the GIL.
//!
//! Its tests are pytest's (`python/tests`), run by `scripts/test.sh` against the real stores.

use pyo3::prelude::*;

mod assembled;
mod checkpoints;
mod containers;
mod dlpack;
mod errors;

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(containers::save, module)?)?;
    module.add_function(wrap_pyfunction!(containers::load, module)?)?;
    module.add_class::<containers::Container>()?;
    module.add_class::<dlpack::HostTensor>()?;
    module.add_class::<checkpoints::Checkpoints>()?;
    module.add_class::<checkpoints::SaveHandle>()?;
    module.add_class::<assembled::Assembled>()?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
