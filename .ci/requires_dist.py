"""Prints a wheel's Requires-Dist lines as a pip requirements file, without the optional extras;
each `NAME==VERSION` argument after the wheel replaces that package's pin."""

import email
import re
import sys
import zipfile


def name_of(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].replace("_", "-").lower()


def main() -> None:
    wheel, replacements = sys.argv[1], sys.argv[2:]
    replaced = {name_of(r): r for r in replacements}
    archive = zipfile.ZipFile(wheel)
    meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    for line in email.message_from_bytes(archive.read(meta)).get_all("Requires-Dist") or []:
        if "extra ==" in line:
            continue
        print(replaced.pop(name_of(line), line))
    for rest in replaced.values():
        print(rest)


if __name__ == "__main__":
    main()
