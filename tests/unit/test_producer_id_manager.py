from strata.coordinator.producer_id_manager import BLOCK_SIZE, ProducerIdManager


def test_producer_ids_are_unique_and_never_reused_after_a_restart(tmp_path):
    first = ProducerIdManager(tmp_path)
    ids = [first.generate() for _ in range(5)]
    assert ids == list(range(5))
    second = ProducerIdManager(tmp_path)  # restart, clean or not: past the persisted block
    assert second.generate() == BLOCK_SIZE
    assert (tmp_path / "producer-id-block").read_text() == f"0 {2 * BLOCK_SIZE}\n"


def test_a_new_block_is_persisted_before_its_ids_are_used(tmp_path):
    m = ProducerIdManager(tmp_path)
    for _ in range(BLOCK_SIZE + 1):
        m.generate()
    assert ProducerIdManager(tmp_path).generate() == 2 * BLOCK_SIZE
