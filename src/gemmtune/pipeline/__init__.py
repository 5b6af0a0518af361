"""A tune resolved once, then run: `plan_for` turns Settings into a frozen Plan (plan.py), and one
pipeline (steps.py) runs it for live tunes and offline replays alike."""
