package strata.testing;

import java.util.Collection;
import java.util.Map;

import org.apache.kafka.connect.sink.SinkRecord;
import org.apache.kafka.connect.sink.SinkTask;

/** The task of {@link DiscardingSinkConnector}. */
public class DiscardingSinkTask extends SinkTask {
    @Override public void start(Map<String, String> props) { }
    @Override public void put(Collection<SinkRecord> records) { }
    @Override public void stop() { }
    @Override public String version() { return "1.0"; }
}
