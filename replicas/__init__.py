"""The rig: drives, replicas and the manifest; sync, verify, repair, status; cold file I/O."""
