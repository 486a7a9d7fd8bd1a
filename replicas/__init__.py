"""The rig: drives, replicas and the manifest; sync, verify, repair, status; cold file I/O."""

from core.interrupt import guard_if_started

guard_if_started("replicas.cli", "replicas")      # a Ctrl-C while the tool is still starting: one line, exit 130
