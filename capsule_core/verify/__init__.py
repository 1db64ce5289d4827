"""`capsules verify`: the session that turns every contract claim into a check (engine), the check
ids (checks), the error models' arithmetic (numerics) and the reference VJP's own check (gradcheck)."""
