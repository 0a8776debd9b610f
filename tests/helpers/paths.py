"""Where the repository, its configs and the test fixtures are."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
FIXTURES = ROOT / "tests" / "fixtures"
