//! WEIGHT_SYNC=nfs and zfs (DeepSeek): what the head exports and how the worker's Docker volumes
//! mount it (the DeepSeek launcher's `nfs-share.sh` options, byte for byte), and the ZFS
//! snapshot/send/receive commands. The volumes are created through the worker's daemon; the
//! export itself and the ZFS commands are printed for the operator, not run.

use std::collections::HashMap;

use sparkgate_config::{Config, Weights};

/// One worker volume backed by an NFS export of the head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsVolume {
    pub name: String,
    /// `docker volume create --driver local --opt K=V …` options.
    pub driver_opts: HashMap<String, String>,
    /// Head directory behind the export.
    pub head_dir: String,
    pub export: String,
}

/// Mount options of the launcher: NFSv4.2, read-only, 8 connections, 1 MiB blocks, hard mounts.
const NFS_MOUNT_OPTS: &str = "nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600";

/// Export options of the launcher's exporter (an NFSv4 pseudo-root with crossmnt).
pub const NFS_EXPORT_OPTS: &str = "ro,sync,no_subtree_check,no_root_squash,insecure,fsid=0,crossmnt";

/// The worker's NFS volumes (model and Engram), or none for a profile without an NFS share.
pub fn nfs_volumes(config: &Config) -> Vec<NfsVolume> {
    let (
        Some(nfs),
        Weights::DeepSeek {
            model_host,
            engram_src,
            nfs_volume_model,
            nfs_volume_engram,
            ..
        },
    ) = (&config.preparation.nfs, &config.storage.weights)
    else {
        return Vec::new();
    };
    let volume = |name: &str, export: &str, head_dir: &str| NfsVolume {
        name: name.to_owned(),
        driver_opts: HashMap::from([
            ("type".to_owned(), "nfs".to_owned()),
            ("o".to_owned(), format!("addr={},{NFS_MOUNT_OPTS}", nfs.server_ip)),
            ("device".to_owned(), format!(":/{export}")),
        ]),
        head_dir: head_dir.to_owned(),
        export: export.to_owned(),
    };
    vec![
        volume(nfs_volume_model, &nfs.export_model, model_host),
        volume(nfs_volume_engram, &nfs.export_engram, engram_src),
    ]
}

/// Creates the worker's NFS volumes (recreating those whose options changed); each volume with
/// whether it was (re)created.
pub async fn ensure_worker_volumes(
    config: &Config,
    worker: &sparkgate_docker::Node,
) -> Result<Vec<(NfsVolume, bool)>, crate::PrepareError> {
    let mut done = Vec::new();
    for v in nfs_volumes(config) {
        let created = worker.ensure_volume(&v.name, &v.driver_opts).await?;
        done.push((v, created));
    }
    Ok(done)
}

/// `/etc/exports` lines for a host NFS server serving the same pseudo-root the worker mounts:
/// the root (`fsid=0`) and one line per tree, readable by NFS_CLIENTS.
pub fn nfs_exports(config: &Config, export_root: &str) -> Vec<String> {
    let Some(nfs) = &config.preparation.nfs else {
        return Vec::new();
    };
    // One `client(options)` per NFS_CLIENTS item: exports(5) gives each client its own options.
    let each = |opts: &str| -> String {
        let items: Vec<String> = nfs
            .clients
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(|c| format!("{c}({opts})"))
            .collect();
        items.join(" ")
    };
    let mut lines = vec![format!("{export_root} {}", each(NFS_EXPORT_OPTS))];
    for v in nfs_volumes(config) {
        lines.push(format!(
            "{export_root}/{} {}",
            v.export,
            each("ro,sync,no_subtree_check,no_root_squash,insecure")
        ));
    }
    lines
}

/// WEIGHT_SYNC=zfs: snapshot the head's dataset and send it to the worker's (full the first time;
/// `previous` makes it incremental).
pub fn zfs_commands(config: &Config, snapshot: &str, previous: Option<&str>) -> Vec<String> {
    let Some(zfs) = &config.preparation.zfs else {
        return Vec::new();
    };
    let incremental = previous.map_or(String::new(), |p| format!("-i @{p} "));
    let mut commands = vec![format!("zfs snapshot {}@{snapshot}", zfs.head_model)];
    // One send per worker: each receives the same snapshot into its own dataset.
    for w in &config.nodes.workers {
        let port = if w.ssh_port == 22 {
            String::new()
        } else {
            format!("-p {} ", w.ssh_port)
        };
        commands.push(format!(
            "zfs send -c {incremental}{}@{snapshot} | ssh {port}{} zfs receive -F {}",
            zfs.head_model, w.ssh, zfs.worker_model
        ));
    }
    commands
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sparkgate_config::LoadOptions;

    use super::*;

    fn config(profile: &str, extra: &[(&str, &str)]) -> Config {
        let mut overrides = BTreeMap::from([
            ("HEAD_IP".to_owned(), "10.0.0.1".to_owned()),
            ("WORKER_IP".to_owned(), "10.0.0.2".to_owned()),
        ]);
        overrides.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        Config::load(&LoadOptions {
            env_file: None,
            profile: Some(profile.into()),
            overrides,
            demo: Default::default(),
            process_env: BTreeMap::from([("HOME".to_owned(), "/home/op".to_owned())]),
            working_dir: "/srv/dsv41".into(),
        })
        .unwrap()
    }

    #[test]
    fn nfs_volumes_carry_the_launchers_mount_options() {
        let c = config("deepseek-v4.1-flash", &[]);
        let v = nfs_volumes(&c);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].name, "dsv41-exl3-weights");
        assert_eq!(v[0].driver_opts["type"], "nfs");
        assert_eq!(
            v[0].driver_opts["o"],
            "addr=10.0.0.1,nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600"
        );
        assert_eq!(v[0].driver_opts["device"], ":/dsv41-exl3");
        assert_eq!(v[0].head_dir, "/srv/dsv41/model");
        assert_eq!(v[1].name, "dsv41-exl3-engram");
        assert_eq!(v[1].driver_opts["device"], ":/dsv41-engram");
    }

    #[test]
    fn the_server_address_and_clients_can_be_set() {
        let c = config(
            "deepseek-v4.1-flash",
            &[("NFS_SERVER_IP", "192.168.100.1"), ("NFS_CLIENTS", "192.168.100.0/24")],
        );
        assert!(nfs_volumes(&c)[0].driver_opts["o"].starts_with("addr=192.168.100.1,"));
        let exports = nfs_exports(&c, "/export");
        assert_eq!(exports[0], format!("/export 192.168.100.0/24({NFS_EXPORT_OPTS})"));
        assert_eq!(
            exports[1],
            "/export/dsv41-exl3 192.168.100.0/24(ro,sync,no_subtree_check,no_root_squash,insecure)"
        );
    }

    #[test]
    fn exports_default_to_the_worker_address() {
        let c = config("deepseek-v4.1-flash", &[]);
        assert!(nfs_exports(&c, "/export")[0].starts_with("/export 10.0.0.2("));
    }

    #[test]
    fn glm_has_no_nfs_share_or_zfs_datasets() {
        let c = config("glm-5.3-flash", &[]);
        assert!(nfs_volumes(&c).is_empty());
        assert!(zfs_commands(&c, "s1", None).is_empty());
    }

    #[test]
    fn zfs_sends_full_then_incremental_snapshots() {
        let c = config("deepseek-v4.1-flash", &[]);
        let full = zfs_commands(&c, "sg-2", None);
        assert_eq!(full[0], "zfs snapshot models/dsv41-exl3@sg-2");
        assert!(
            full[1].starts_with("zfs send -c models/dsv41-exl3@sg-2 | ssh ")
                && full[1].ends_with(" zfs receive -F models/dsv41-exl3"),
            "{}",
            full[1]
        );
        let inc = zfs_commands(&c, "sg-3", Some("sg-2"));
        assert!(
            inc[1].starts_with("zfs send -c -i @sg-2 models/dsv41-exl3@sg-3 | "),
            "{}",
            inc[1]
        );
    }
}
