"""What the tests share: paths, the CLI runners, task cards, fixtures' builders. Not tests."""
