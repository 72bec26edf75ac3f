//! A node's facts, read by one POSIX shell script on the node (the head's locally, a worker's
//! over its SSH session): kernel, NVIDIA driver, the ranks' interface (state, MTU, speed), the
//! RoCE GID entry, MemAvailable, free disk, the weights' files and sizes, and whether the peer
//! answers over the interface. Every path is read under a root (NODE_ROOT: `/` on a real
//! node) and commands are looked up in `<root>/bin` first, so tests point a node's facts
//! elsewhere; a fact the node does not have is absent, never a failed read.

use std::collections::BTreeMap;

/// What the script is told about a node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ask {
    pub root: String,
    pub ifname: String,
    pub hca: String,
    pub gid_index: u32,
    /// The directory whose files and sizes are compared (empty: none).
    pub weights: String,
    /// The address the peer answers on (the head's for a worker, a worker's for the head).
    pub peer: String,
    /// The directory whose filesystem's free space counts (LOG_DIR).
    pub log_dir: String,
    /// Where MemAvailable is read (the head's MEMINFO_PATH on a real root).
    pub meminfo: String,
}

/// The script; its arguments are `Ask`'s fields in order.
pub(crate) const SCRIPT: &str = r#"r="$1"; ifn="$2"; hca="$3"; gid="$4"; w="$5"; peer="$6"; logs="$7"; mem="$8"
PATH="$r/bin:$PATH"
rd() { cat "$r$1" 2>/dev/null | head -n 1; }
echo "kernel=$(rd /proc/sys/kernel/osrelease)"
echo "driver=$(head -n 1 "$r/proc/driver/nvidia/version" 2>/dev/null | grep -o '[0-9][0-9]*\.[0-9][0-9.]*' | head -n 1)"
echo "if_state=$(rd /sys/class/net/$ifn/operstate)"
echo "if_mtu=$(rd /sys/class/net/$ifn/mtu)"
echo "if_speed=$(rd /sys/class/net/$ifn/speed)"
echo "gid=$(rd /sys/class/infiniband/$hca/ports/1/gids/$gid)"
echo "mem_available_kib=$(awk '/^MemAvailable:/ {print $2}' "$mem" 2>/dev/null)"
d="$logs"; while [ -n "$d" ] && [ ! -e "$d" ]; do d=$(dirname "$d"); done
echo "disk_free_kib=$(df -Pk "${d:-/}" 2>/dev/null | awk 'NR==2 {print $4}')"
if [ -n "$w" ] && [ -d "$w" ]; then
  echo "weights=present"
  find -L "$w" -type f -printf 'weight=%P\t%s\n' 2>/dev/null | LC_ALL=C sort
elif [ -n "$w" ]; then echo "weights=absent"; fi
if [ -n "$peer" ] && ! command -v ping >/dev/null 2>&1; then echo "peer=no_ping"
elif [ -n "$peer" ]; then
  if ping -c 1 -W 2 "$peer" >/dev/null 2>&1; then echo "peer=answers"; else echo "peer=silent"; fi
fi
"#;

/// The script that reads the node's clock (alone, so its round trip bounds the reading).
pub(crate) const CLOCK: &str = r#"PATH="$1/bin:$PATH"; date +%s.%N"#;

/// A node's facts as the script printed them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Facts {
    values: BTreeMap<String, String>,
    /// The weights' files and sizes (relative path → bytes).
    pub weights: BTreeMap<String, u64>,
}

impl Facts {
    /// Reads the script's output: `name=value` lines, `weight=path<TAB>bytes` for each file.
    pub(crate) fn parse(text: &str) -> Facts {
        let mut f = Facts::default();
        for line in text.lines() {
            let Some((name, value)) = line.split_once('=') else {
                continue;
            };
            if name == "weight" {
                if let Some((path, size)) = value.rsplit_once('\t') {
                    f.weights.insert(path.to_owned(), size.trim().parse().unwrap_or(0));
                }
            } else {
                f.values.insert(name.to_owned(), value.trim().to_owned());
            }
        }
        f
    }

    /// A fact, when the node has it (an empty value is absent).
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    /// A numeric fact.
    pub(crate) fn number(&self, name: &str) -> Option<f64> {
        self.get(name)?.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_lines_are_read_and_an_empty_fact_is_absent() {
        let f = Facts::parse(
            "kernel=6.8.0-1015-nvidia\ndriver=\nif_mtu=9000\nweights=present\nweight=a/model-00001.safetensors\t4096\nweight=config.json\t12\n",
        );
        assert_eq!(f.get("kernel"), Some("6.8.0-1015-nvidia"));
        assert_eq!(f.get("driver"), None);
        assert_eq!(f.number("if_mtu"), Some(9000.0));
        assert_eq!(f.weights.get("a/model-00001.safetensors"), Some(&4096));
        assert_eq!(f.weights.len(), 2);
    }
}
