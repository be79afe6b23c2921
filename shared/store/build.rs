//! `sqlx::migrate!` embeds the migration files at compile time but cannot tell Cargo about them on
//! stable Rust, so a changed or added migration would otherwise be missed until a clean build.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations/sqlite");
    println!("cargo:rerun-if-changed=../../migrations/mysql");
}
