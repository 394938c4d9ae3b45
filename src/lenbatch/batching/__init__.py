"""The planning library: lengths, the batch specification, padding metrics, strategies, boundaries, schedules. numpy only."""
