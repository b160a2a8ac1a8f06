//! # tollgate-planner
//!
//! Planning tools over tollgate's real limiter: replay a traffic trace
//! (`simulate`), size a fleet (`capacity`), derive limits from usage
//! (`derive`).
