"""The split tuner (`planner tune`): pure state (`state`), the text it shows (`view`), rig I/O
(`load`) and the Textual app that only renders (`app`)."""
