//! The job's table this process attached, for every layer of the library: the fd table's own
//! checks read it as the hooks do (`ops::detour::table`), without reaching up to them.

use std::sync::OnceLock;

use granary_shm::Table;

/// Once the constructor mapped and accepted it; never unset (a withdrawn table says so itself:
/// `Table::is_valid`).
static TABLE: OnceLock<Table> = OnceLock::new();

/// The table hooks consult from now on. Constructor only.
pub fn attach(table: Table) -> &'static Table {
    TABLE.get_or_init(|| table)
}

/// The attached table, if any.
#[inline]
pub fn table() -> Option<&'static Table> {
    TABLE.get()
}
