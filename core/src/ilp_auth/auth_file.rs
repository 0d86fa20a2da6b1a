//! QuestDB's ILP auth file (`line.tcp.auth.db.path`).

use super::PublicKey;

/// The `server.conf` key that tells QuestDB where its ILP auth file is.
pub const AUTH_DB_PATH_KEY: &str = "line.tcp.auth.db.path";
/// Where the operator mounts the auth file, relative to the QuestDB root directory (QuestDB
/// resolves a relative path against its root).
pub const AUTH_DB_PATH: &str = "conf/auth.txt";
/// The only key type QuestDB accepts in the auth file.
pub const KEY_TYPE: &str = "ec-p-256-sha256";

/// Renders the auth file: one `<kid> ec-p-256-sha256 <x> <y>` line per key, sorted by kid, each
/// ending in a newline.
///
/// Sorting makes the content (and so the pod-template hash that restarts QuestDB) depend only on
/// the set of keys, not on the order Secrets were listed in. No keys gives an empty string: with
/// the path still configured, QuestDB keeps ILP auth on and refuses every client.
///
/// The caller must not pass two keys with the same kid (QuestDB refuses to start on one);
/// [`super::collect`] never produces them.
pub fn render_auth_file(keys: &[PublicKey]) -> String {
    let mut sorted: Vec<&PublicKey> = keys.iter().collect();
    sorted.sort();
    sorted
        .into_iter()
        .map(|key| format!("{} {KEY_TYPE} {} {}\n", key.kid(), key.x(), key.y()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ilp_auth::testing::TestKey;

    fn key(kid: &str, seed: u8) -> PublicKey {
        let k = TestKey::derived(kid, seed);
        PublicKey::new(&k.kid, &k.x, &k.y).expect("valid test key")
    }

    #[test]
    fn no_keys_render_an_empty_file() {
        assert_eq!(render_auth_file(&[]), "");
    }

    #[test]
    fn one_line_per_key_in_questdb_format() {
        let alice = TestKey::rfc7515_a3("alice");
        let public = PublicKey::new(&alice.kid, &alice.x, &alice.y).unwrap();
        assert_eq!(
            render_auth_file(&[public]),
            "alice ec-p-256-sha256 f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU \
             x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0\n"
        );
    }

    #[test]
    fn lines_are_sorted_by_kid_whatever_the_input_order() {
        let (a, b, c) = (key("alice", 1), key("bob", 2), key("carol", 3));
        let file = render_auth_file(&[c.clone(), a.clone(), b.clone()]);
        assert_eq!(file, render_auth_file(&[a, b, c]));
        let kids: Vec<&str> = file
            .lines()
            .map(|line| line.split(' ').next().unwrap())
            .collect();
        assert_eq!(kids, ["alice", "bob", "carol"]);
        assert!(file.ends_with('\n'));
        assert!(file
            .lines()
            .all(|line| line.split(' ').nth(1) == Some(KEY_TYPE) && line.split(' ').count() == 4));
    }
}
