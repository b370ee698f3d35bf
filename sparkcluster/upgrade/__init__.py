"""`sparkcluster upgrade` and `rollback` (`upgrade`): a new image or revision kept only once it serves
as well as the last good serve did, as steps walked by the step engine (`steps/`)."""
