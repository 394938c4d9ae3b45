"""Chat data in: sources, chat formatting, tokenizing."""
