"""The single-role training stages (reward model, SFT, DPO): their entry, launch, loop and what each does in it."""
