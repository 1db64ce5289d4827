"""The renderers: tables, JSON, JUnit, CSV and Markdown of every command's results. They never compute."""
