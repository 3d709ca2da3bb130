//! Shared pieces of the example programs: progress output and timeline tables.
