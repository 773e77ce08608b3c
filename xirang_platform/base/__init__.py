"""The bottom layer every other one may read: the capacity unit (`units`) and the rules for values
people type or write into files (`user_input`: names, quotas, echoes). It imports nothing of the project
but itself (DESIGN.md section 2, docs/design-notes.md record A17)."""
