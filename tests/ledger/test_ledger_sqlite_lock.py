"""The embedded ledger loses no write while another process opens and closes it (issue 20, item 7).

The platform keeps one `Ledger` open and writes through it; meanwhile the CLI (`xirang quota show`)
opens the same file, reads balances and closes it, again and again. The migration lock must not
open the database file itself: closing any handle of a file drops the process's POSIX locks on it,
so the CLI's last close would see no other user and delete `-wal`/`-shm` under the platform, whose
later writes would go to an unlinked file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from xirang_platform.ledger import Ledger

WRITES = 150

# The platform's writer: one Ledger, migrated on open as `GpuPoolResource` opens it, kept open;
# each write is a reserve, a commit and a release of one request. It reports the -wal file's inode
# before its first write and after its last one.
WRITER = """
import json, os, sys
from tests.ledger.ledger_helpers import alloc
from xirang_platform.ledger import Ledger

url, writes = sys.argv[1], int(sys.argv[2])
wal = url.removeprefix("sqlite:///") + "-wal"
ledger = Ledger(url)
ledger.add_tenant("acme", 8000)
ledger.add_project("acme", "vision", 8000)
first = os.stat(wal).st_ino
print("ready", flush=True)
for i in range(writes):
    rid = f"r{i:04d}"
    ledger.reserve(alloc(rid))
    ledger.commit(rid)
    ledger.release(rid)
last = os.stat(wal).st_ino if os.path.exists(wal) else None
print(json.dumps({"first": first, "last": last, "balances": len(ledger.entries())}), flush=True)
ledger.close()
"""


def test_a_cli_opening_and_closing_the_ledger_loses_no_write_of_the_platform(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, str(WRITES)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "ready"
    opened = 0
    while writer.poll() is None:  # the CLI's way: open (migrating), read the balances, close
        cli = Ledger(url)
        cli.balances()
        cli.close()
        opened += 1
    report = json.loads(writer.stdout.read())
    assert writer.returncode == 0

    assert opened > 0
    assert report["last"] == report["first"], "the -wal file was unlinked under the writer"
    fresh = Ledger(url, migrate=False)
    releases = [e for e in fresh.entries(kind="release") if e.account == "acme"]
    assert len(releases) == WRITES
    assert len(fresh.entries()) == report["balances"]
    assert fresh.allocations() == []
    assert fresh.rebuild().ok
    fresh.close()


def test_the_migration_lock_is_a_file_beside_the_database_not_the_database(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    Ledger(f"sqlite:///{path}").close()

    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.sqlite", "ledger.sqlite.lock"]
