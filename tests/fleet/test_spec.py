"""The fleet file: its shape, and one line naming the key for each mistake."""

import pytest

from core.errors import RigError
from fleet.spec import FleetSpec, NodeSpec, parse_fleet


def test_a_fleet_file_reads_into_its_nodes():
    spec = parse_fleet('manifest = "m.json"\nengine = "colibri"\n\n[[node]]\nname = "alpha"\nrig = "/srv/rig"\n'
                       '[[node]]\nname = "10.0.0.7"\nrig = "/data/rig"\n', "fleet.toml")
    assert spec == FleetSpec((NodeSpec("alpha", "/srv/rig"), NodeSpec("10.0.0.7", "/data/rig")), "m.json", "", "colibri")


@pytest.mark.parametrize("text, says", [
    ("[[node]\n", "not valid TOML"),
    ("schema = 2\n[[node]]\nname = 'a'\nrig = '/r'\n", "schema 2"),
    ("manifest = 3\n[[node]]\nname = 'a'\nrig = '/r'\n", "'manifest' must be a string"),
    ("", "no [[node]] tables"),
    ("[[node]]\nrig = '/r'\n", "key 'name' missing"),
    ("[[node]]\nname = 'a'\nrig = 'rig'\n", "absolute path"),
    ("[[node]]\nname = 'a'\nrig = '/r'\nport = 1\n", "unknown key(s) port"),
    ("[[node]]\nname = 'a'\nrig = '/r'\n[[node]]\nname = 'a'\nrig = '/s'\n", "listed twice"),
])
def test_each_mistake_is_one_line_naming_the_file(text, says):
    with pytest.raises(RigError) as e:
        parse_fleet(text, "fleet.toml")
    assert str(e.value).startswith("fleet.toml") and says in str(e.value) and "\n" not in str(e.value)
